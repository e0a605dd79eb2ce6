"""`sim ablate`: what each mechanism of a strategy buys, added one at a time ([PI2] §7.5, Fig. 14).

It takes every run option of ``sim run``: its signature is built from ``sim run``'s own
typer options (all but the output flags, :data:`sim.commands.run.OUTPUT_FLAGS`), so a run
option added there is an ablation option at once, and both resolve them the same way
(:func:`sim.commands.run.run_request`). ``--ladder`` picks the mechanisms and their order
(default: the strategy's, :mod:`sim.explore.ablation`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from sim.commands import run as run_cmd


def register(app: typer.Typer) -> None:
    app.command("ablate")(ablate)


# ablate's own options, after sim run's.
OWN_OPTIONS = [
    inspect.Parameter("ladder", inspect.Parameter.KEYWORD_ONLY, annotation=str | None, default=typer.Option(
        None, "--ladder", metavar="M1,M2,...",
        help="Mechanisms to add, in order, to a baseline with all of them off (default: the strategy's, e.g. "
             "bundle,neuron_cache,pipeline,xpu for powerinfer2; hybrid,predictor,window,bundling for llm-in-flash).")),
    inspect.Parameter("json_out", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--json", help="Print the rungs as JSON rows.")),
    inspect.Parameter("plot", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None, default=typer.Option(
        None, "--plot", help="Draw the ladder as bars (.png, .pdf or .svg).")),
]


def run_options() -> list[inspect.Parameter]:
    """``sim run``'s run options, as its signature declares them (keyword-only here)."""
    params = inspect.signature(run_cmd.run, eval_str=True).parameters.values()
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params if p.name not in run_cmd.OUTPUT_FLAGS]


def ablate(**options: Any) -> None:
    """Run a strategy's baseline, then add its mechanisms one by one; print each rung's tokens/s,
    its speed-up over the rung before and the busiest resource."""
    from sim.explore.ablation import run_ladder
    from sim.outputs import PLOT_SUFFIXES, check_output, json_text

    ladder, json_out, plot = (options.pop(p.name) for p in OWN_OPTIONS)
    check_output(plot, "--plot", suffixes=PLOT_SUFFIXES, inputs=run_cmd.input_files(**options))
    request = run_cmd.run_request(**options)
    if request.auto_length:
        from sim.errors import SimError

        raise SimError("sim ablate runs every rung at one length; give a count (default 128)", field="--decode-tokens")
    with request.knob_errors():
        table = run_ladder(request.config, ladder)
    config = request.config.dump()
    title = f"{config['model']} on {config['device']} ({config['strategy']}, {config['mode']}): {_setting(config)}"
    if plot is not None:
        from sim.plots import draw_ablation

        draw_ablation(table, plot, strategy=config["strategy"], title=title,
                      caption=f"sim ablate, {config['decode_tokens']} decode tokens a rung; the label over a bar is "
                              "its speed-up over the bar before")
    rows = table.to_dict("records")
    if json_out:
        print(json_text(rows), flush=True)
        return
    out = Table("rung", "tokens/s", "speed-up", "vs baseline", "hit ratio", "flash MB/token", "busiest (busy)",
                title=title)
    for r in rows:
        step = r["speedup"]
        out.add_row(r["rung"], f"{r['decode_tokens_per_s']:.3g}", "-" if step != step else f"{step:.2f}x",
                    f"{r['speedup_total']:.2f}x", f"{r['cache_hit_ratio']:.1%}",
                    f"{r['flash_bytes_per_token'] / 1e6:.3g}", _busiest(r))
    console = Console(width=120)
    run_cmd.print_edits(console, request)
    console.print(out)
    for warning in dict.fromkeys(w for r in rows for w in r["warnings"]):
        console.print(f"[yellow]warning:[/yellow] {warning}")
    if plot is not None:
        console.print(f"wrote plot: {plot}")


def _busiest(row: dict[str, Any]) -> str:
    """``flash (60%)``; ``-`` where the run reports no utilisation (the analytic mode)."""
    return "-" if row["bottleneck"] == "-" else f"{row['bottleneck']} ({row['bottleneck_busy']:.0%})"


def _setting(config: dict[str, Any]) -> str:
    if config["memory_budget"] is not None:
        return f"budget {config['memory_budget']}"
    return f"offload {config['offload']}" if config["offload"] is not None else "the device's usable DRAM"


ablate.__signature__ = inspect.Signature([*run_options(), *OWN_OPTIONS])  # type: ignore[attr-defined]
