"""`sim sensitivity`: which inputs move decode tokens/s most (Morris screening, sim.explore.sensitivity)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import typer

from sim.commands import run as run_cmd
from sim.commands.run_options import with_run_options


def register(app: typer.Typer) -> None:
    app.command("sensitivity")(sensitivity)


@with_run_options()
def sensitivity(
    params: str | None = typer.Option(None, "--params", help="Inputs to screen (names or globs, comma-separated; "
                                      "default: the calibrated unknowns reaching the run and the profile fields)."),
    trajectories: int | None = typer.Option(
        None, "--trajectories", help="Morris trajectories (evaluations: N x (inputs+1)); default 1000 where the "
                                     "analytic re-evaluation is split (powerinfer2: milliseconds an evaluation), "
                                     "else 8."),
    sampler_seed: int = typer.Option(0, "--sampler-seed", help="Seed of the Morris sampler."),
    sets: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="As in sim run."),
    calibration: str | None = typer.Option(None, "--calibration", help="As in sim run."),
    plot: Path | None = typer.Option(None, "--plot", help="Draw mu* as bars (.png, .pdf or .svg)."),
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    **options: Any,
) -> None:
    """Rank calibrated unknowns and profile fields by their effect on decode tokens/s (SALib Morris)."""
    from rich.console import Console
    from rich.table import Table

    from sim.checks import check_int
    from sim.explore.sensitivity import default_trajectories, morris
    from sim.outputs import PLOT_SUFFIXES, check_output, json_text

    if trajectories is not None:
        check_int(trajectories, "--trajectories", 2, 1000)
    check_output(plot, "--plot", suffixes=PLOT_SUFFIXES, inputs=run_cmd.input_files(**options, plan=None))
    request = run_cmd.run_request(plan=None, sets=sets, calibration=calibration, **options)
    if trajectories is None:
        trajectories = default_trajectories(request.uncalibrated)
    with request.knob_errors():
        rows = morris(request.uncalibrated, request.applied, selection=params, trajectories=trajectories,
                      seed=sampler_seed, user_paths=request.user_paths)
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 0.4 * len(rows) + 1.5))
        ax.barh([r["input"] for r in rows][::-1], [r["mu_star"] for r in rows][::-1],
                xerr=[r["mu_star_conf"] for r in rows][::-1])
        ax.set_xlabel("Morris mu* (tokens/s)")
        ax.set_title(f"what moves decode tokens/s ({request.config.decode_tokens} decode tokens, analytic)")
        fig.tight_layout()
        fig.savefig(plot)
        plt.close(fig)
    if json_out:
        print(json_text(rows))
        return
    table = Table("rank", "input", "kind", "mu* (tokens/s)", "mu", "sigma",
                  title=f"Morris screening, {trajectories} trajectories, {request.config.decode_tokens} decode tokens")
    for i, r in enumerate(rows, 1):
        table.add_row(str(i), r["input"], r["kind"], f"{r['mu_star']:.3g} ± {r['mu_star_conf']:.2g}",
                      f"{r['mu']:.3g}", f"{r['sigma']:.3g}")
    Console().print(table)
    for i, (r, nxt) in enumerate(itertools.pairwise(rows), 1):
        if r["tied_with_next"] and i <= 3:  # the top three's order is what a reader takes away
            print(f"ranks {i} and {i + 1} are not resolved at {trajectories} trajectories: {r['input']} "
                  f"{r['mu_star']:.3g} ± {r['mu_star_conf']:.2g} and {nxt['input']} {nxt['mu_star']:.3g} ± "
                  f"{nxt['mu_star_conf']:.2g} overlap (read them as tied; more --trajectories separate them)")
    if plot is not None:
        print(f"wrote {plot}")
