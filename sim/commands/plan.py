"""`sim plan`: the strategy knobs (PowerInfer-2's by default) that run a model fastest on a device at a budget."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from sim.commands.run_options import run_option
from sim.commands.settings import own_preset, parse_sets, profile_sets
from sim.engine.config import DEFAULT_DECODE_TOKENS
from sim.errors import SimError
from sim.outputs import check_output


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


def plan(
    device: str = run_option("device"),
    model: str = run_option("model"),
    memory_budget: str = run_option("memory_budget", ..., help="DRAM the app may use: 12GB, 12GiB or 50%."),
    objective: str = typer.Option("tokens_per_s", "--objective", help="tokens_per_s (fastest) or energy (J/token)."),
    min_tokens_per_s: float | None = typer.Option(None, "--min-tokens-per-s", help="Reject plans slower than this."),
    out: Path | None = typer.Option(None, "--out", help="Write the plan YAML here (for sim run --plan)."),
    workers: int = typer.Option(1, "--workers", help="Local worker processes for the evaluations."),
    prune_tokens: int = typer.Option(8, "--prune-tokens", help="Decode tokens per analytic (pruning) evaluation."),
    confirm_tokens: int = typer.Option(DEFAULT_DECODE_TOKENS, "--confirm-tokens",
                                       help="Decode tokens per DES confirmation (the default run length)."),
    warmup_tokens: int = run_option("warmup_tokens"),
    confirm: int = typer.Option(3, "--confirm", help="Best analytic candidates confirmed with the DES."),
    passes: int = typer.Option(2, "--passes", help="Rounds of one-knob-at-a-time search."),
    seed: int = run_option("seed", help="Random seed (synthetic trace)."),
    preset: str | None = run_option("preset"),
    strategy: str = run_option("strategy", help="The strategy whose knobs are searched (one that declares "
                               "knobs to plan)."),
    sets: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE",
        help="Repeatable; VALUE is YAML; one edit per field. A profile field by its path as in sim run (plan for a "
             "phone that does not exist yet): device.cpu.clusters.big.cores=3, "
             "device.storage.rand_read.*.gbps:scale=2. The plan records the edits."),
    calibration: str | None = typer.Option(
        None, "--calibration", help="Calibrated unknowns every candidate applies (`sim calibrate --out`): default "
                                    "the bundled validation/calibration.yaml; none: the microbenchmark-only "
                                    "prediction."),
) -> None:
    """Search compute/I-O cores, cluster size, hot/cold split, NPU share and cache policy; print the plan."""
    from rich.console import Console
    from rich.table import Table

    from sim.explore.planner import plan as search

    check_output(out, "--out", suffixes=(".yaml", ".yml"),  # before minutes of search, not after
                 inputs={"--device": device, "--model": model})
    from sim.calibrate.calibration import load_calibration

    load_calibration(calibration)  # a bad file fails here, under its own name, before the search
    overrides, typed = parse_sets(sets)
    profile_sets(overrides)
    preset = own_preset(model, overrides, None, preset)
    # the plan names the profiles as given and records the edits on them, as a run is given them
    result = search(device, model, strategy=strategy, memory_budget=memory_budget, objective=objective,
                    min_tokens_per_s=min_tokens_per_s, prune_tokens=prune_tokens, confirm_tokens=confirm_tokens,
                    warmup_tokens=warmup_tokens, confirm=confirm, passes=passes, seed=seed, preset=preset,
                    overrides=overrides, workers=workers, calibration=calibration)
    result.set_args = typed
    text = result.to_yaml()
    if out is not None:
        try:
            out.write_text(text)
        except OSError as exc:
            raise SimError(f"cannot write: {exc.strerror or exc}", source=str(out), field="--out") from None
    print(text, end="")
    console = Console(stderr=True)
    table = Table("plan", "tokens/s (DES)", "analytic", "J/token", "knobs changed from the default",
                  title=f"{result.analytic_evaluations} analytic evaluations, {result.des_evaluations} confirmed "
                        f"with the DES ({result.settings['decode_tokens']} decode tokens)")
    for label, c in [("chosen", result.best)] + [(f"runner-up {i + 1}", r) for i, r in enumerate(result.runners_up)]:
        table.add_row(label, _fmt(c.tokens_per_s), _fmt(c.analytic_tokens_per_s), _fmt(c.energy_j_per_token),
                      ", ".join(f"{k}={v}" for k, v in c.knobs.items()) or "(default configuration)")
    console.print(table)
    speedup = result.best.tokens_per_s / result.default.tokens_per_s if result.default.tokens_per_s else math.nan
    console.print(f"predicted {result.best.tokens_per_s:.3g} tokens/s; default configuration "
                  f"{result.default.tokens_per_s:.3g} tokens/s ({speedup:.2f}x); calibration: "
                  f"{result.settings.get('calibration', 'none')}", markup=False, highlight=False)
    if out is not None:
        console.print(f"wrote {out}")


def _fmt(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"
