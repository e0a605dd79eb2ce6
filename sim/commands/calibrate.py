"""`sim calibrate`: estimate the named unknowns on published points; `sim calibrate params` lists them."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from sim.commands.run_options import run_option

app = typer.Typer(help="Fit the named unknowns (what no microbenchmark gives) to published points.",
                  invoke_without_command=True, no_args_is_help=False)


@app.callback()
def calibrate_cmd(
    ctx: typer.Context,
    points: str | None = typer.Option(None, "--points", help="Published point ids or globs, comma-separated "
                                      "(default: every modelled point some selected unknown reaches, but those "
                                      "published.yaml marks fitted: false)."),
    params: str | None = typer.Option(None, "--params", help="Unknown names or globs, comma-separated "
                                      "(default: all; `sim calibrate params` lists them)."),
    out: Path | None = typer.Option(None, "--out", help="Write the calibration here (.yaml)."),
    decode_tokens: int = run_option("decode_tokens",
                                     help="Decode tokens per point run (the default run length, as sim validate's)."),
    max_evals: int = typer.Option(200, "--max-evals", help="Evaluations per fit (each runs every point once)."),
    cv_max_evals: int | None = typer.Option(
        None, "--cv-max-evals", help="Evaluations per cross-validation refit (default: --max-evals); each starts "
                                     "at the priors' centres (see --cv-start)."),
    cv_start: str = typer.Option(
        "centre", "--cv-start", help="centre: each fold searches from the priors' centres only; both: also from "
                                     "the full fit's values, kept only if the fold's own points' cost is over 5% "
                                     "lower (the file names each fold's start under fold_starts)."),
    cv_jacobian: str = typer.Option(
        "difference", "--cv-jacobian", help="difference: a fold's search measures its Jacobian by differences at "
                                           "each step it takes; secant: at its start only, then updates it along "
                                           "each step (Broyden), running no simulation beyond the steps' own."),
    loss: str = typer.Option("linear", "--loss", help="linear: least squares on log(predicted/published); soft_l1, "
                                                     "huber: robust, a residual beyond 20% weighs like its size, not "
                                                     "its square; cauchy, arctan: ever less as it grows."),
    workers: int | None = typer.Option(None, "--workers", help="Processes running the points' simulations "
                                                                "(default: one per core)."),
    start: Path | None = typer.Option(None, "--start", help="A calibration file whose values start the full fit "
                                                            "(default: the priors' centres); folds start at the "
                                                            "priors' centres whatever this says (and, with "
                                                            "--cv-start both, at the full fit's values)."),
    no_cv: bool = typer.Option(False, "--no-cv", help="Skip the leave-one-source-group-out refits."),
    json_out: bool = typer.Option(False, "--json", help="Print the calibration as JSON."),
) -> None:
    """Fit the selected unknowns by bounded least squares on log(predicted/published)."""
    if ctx.invoked_subcommand is not None:
        return
    import yaml

    from sim.calibrate.apply import default_points
    from sim.calibrate.calibration import calibrate
    from sim.calibrate.unknowns import load_unknowns, select
    from sim.checks import check_int
    from sim.outputs import check_output, json_text
    from sim.validation import check_decode_tokens, load_points

    check_decode_tokens(decode_tokens)
    check_int(max_evals, "--max-evals", 1, 100_000)
    if cv_max_evals is not None:
        check_int(cv_max_evals, "--cv-max-evals", 1, 100_000)
    from sim.calibrate.unknowns import registry_path
    from sim.validation import published_path

    # the files the fit reads: the unknowns' registry and the published points too, which an
    # editable install keeps in the user's checkout
    check_output(out, "--out", suffixes=(".yaml", ".yml"),
                 inputs={"--start": start, "unknowns registry": registry_path(), "published points": published_path()})
    from sim.calibrate.evaluator import default_workers
    from sim.calibrate.fit import LOSSES

    if loss not in LOSSES:
        from sim.errors import SimError

        raise SimError(f"must be one of {', '.join(LOSSES)}, got {loss!r}", field="--loss")
    if workers is not None:
        check_int(workers, "--workers", 1, 256)
    unknowns = select(load_unknowns(), params, "unknown", "--params")
    start_values = None
    if start is not None:
        from sim.calibrate.calibration import load_calibration

        start_values = load_calibration(start).values
    all_points = load_points()
    left_out: list[str] = []
    if points is None:
        chosen, left_out = default_points(all_points, unknowns)
    else:
        chosen = select(all_points, points, "point", "--points", key=lambda p: str(p["id"]))
    console = Console(stderr=True)
    named_out = [str(p["id"]) for p in chosen if p.get("fitted") is False]
    if named_out:
        console.print(f"note: fitting {', '.join(named_out)}, which published.yaml marks fitted: false "
                      "(see its known_gap), because --points selects it")

    def progress(stage: str, n: int, cost: float) -> None:
        console.print(f"[dim]{stage}: evaluation {n}, sum of squared log errors {cost:.4g}[/dim]")

    made_by = " ".join(["sim calibrate", *(f"--points '{points}'" for _ in [0] if points),
                        *(f"--params '{params}'" for _ in [0] if params), f"--decode-tokens {decode_tokens}",
                        f"--max-evals {max_evals}", *([f"--cv-max-evals {cv_max_evals}"] if cv_max_evals else []),
                        *([f"--cv-start {cv_start}"] if cv_start != "centre" else []),
                        *([f"--cv-jacobian {cv_jacobian}"] if cv_jacobian != "difference" else []),
                        *([f"--loss {loss}"] if loss != "linear" else []), *([f"--start {start}"] if start else []),
                        *(["--no-cv"] if no_cv else [])])
    cal, full = calibrate(chosen, unknowns, decode_tokens=decode_tokens, max_evals=max_evals, cv_max_evals=cv_max_evals,
                          cross_validate=not no_cv, made_by=made_by, loss=loss, cv_start=cv_start,
                          cv_jacobian=cv_jacobian, workers=workers or default_workers(), start=start_values,
                          progress=progress, not_fitted=left_out)
    mapping = cal.to_mapping()
    if out is not None:
        out.write_text(yaml.safe_dump(mapping, sort_keys=False, width=110, allow_unicode=True), encoding="utf-8")
    if json_out:
        print(json_text(mapping))
        return
    table = Table("unknown", "value", "± 1 sigma", "prior", "unit", title=f"calibration on {len(chosen)} points")
    for u in cal.unknowns:
        mark = " (at bound)" if u.name in cal.at_bound else ""
        table.add_row(u.name, f"{cal.values[u.name]:.4g}{mark}", f"{cal.sigma[u.name]:.2g}",
                      f"[{u.prior[0]:g}, {u.prior[1]:g}]", u.unit)
    res = Table("point", "log error before", "after", title="residuals, log(predicted / published)")
    for i in full.points:
        res.add_row(i, f"{full.initial_residuals[i]:+.3f}", f"{full.residuals[i]:+.3f}")
    out_console = Console(width=160)
    out_console.print(table)
    out_console.print(res)
    for warning in full.warnings:
        out_console.print(f"warning: {warning}")
    if left_out:
        out_console.print(f"scored, not fitted (fitted: false in published.yaml): {', '.join(left_out)}")
    if out is not None:
        out_console.print(f"wrote {out}; apply it with `sim validate --calibration {out}`")


@app.command("params")
def params_cmd(
    params: str | None = typer.Option(None, "--params", help="Unknown names or globs, comma-separated."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the calibratable unknowns: path, unit, meaning, prior and its evidence, scope."""
    from sim.calibrate.unknowns import load_unknowns, registry_path, select
    from sim.outputs import json_text

    unknowns = select(load_unknowns(), params, "unknown", "--params")
    if json_out:
        print(json_text([json.loads(u.model_dump_json()) for u in unknowns]))
        return
    table = Table("name", "path", "unit", "prior", "scope", "meaning / evidence",
                  title=f"calibratable unknowns ({registry_path().name})", show_lines=True)
    for u in unknowns:
        scope = ", ".join(f"{k}={v}" for k, v in u.scope.items())
        table.add_row(u.name, u.path, u.unit, f"[{u.prior[0]:g}, {u.prior[1]:g}]"
                      + (" log" if u.transform == "log" else ""), scope, f"{u.meaning}\n[dim]{u.evidence}[/dim]")
    Console(width=200).print(table)
