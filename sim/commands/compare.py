"""`sim compare`: one configuration on several devices (or strategies, or calibrations), side by side.

Every run option of ``sim run`` applies to all the runs; ``--devices``, ``--strategies`` and
``--calibrations`` (comma-separated) list what varies, and the runs are their combinations.
Each row is a ``sim run`` of that combination (:func:`sim.commands.run.run_request`), with
its steady-state 95% interval, optionally its 90% prediction interval (``--uncertainty``),
and its bottleneck, so two phones are compared as a user would read them.
"""

from __future__ import annotations

import itertools
from typing import Any

import typer

from sim.commands import run as run_cmd
from sim.commands.run_options import with_run_options
from sim.explore.uncertainty import DEFAULT_SAMPLES


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)


def _names(text: str | None) -> list[str | None]:
    return [n.strip() for n in text.split(",") if n.strip()] if text else [None]


@with_run_options(wider=("decode_tokens",))
def compare(
    devices: str | None = typer.Option(None, "--devices", help="Devices to compare, comma-separated."),
    strategies: str | None = typer.Option(None, "--strategies", help="Strategies to compare, comma-separated."),
    calibrations: str | None = typer.Option(None, "--calibrations",
                                            help="Calibrations to compare (files, or none), comma-separated."),
    sets: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="As in sim run; applied to every run."),
    uncertainty: bool = typer.Option(False, "--uncertainty", help="Add each run's 90% prediction interval."),
    samples: int = typer.Option(DEFAULT_SAMPLES, "--samples", help="Samples per run for --uncertainty (as sim run's)."),
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    **options: Any,
) -> None:
    """Run one configuration on several devices, strategies or calibrations; print one table."""
    from rich.console import Console
    from rich.table import Table

    from sim.errors import SimError
    from sim.outputs import json_text

    combos = list(itertools.product(_names(devices), _names(strategies), _names(calibrations)))
    # sim run's flag -> this command's list flag and what it was given
    lists = {"--device": ("--devices", devices), "--strategy": ("--strategies", strategies),
             "--calibration": ("--calibrations", calibrations)}
    given = [flag for flag, text in lists.values() if text]
    if len(combos) < 2:
        raise SimError("give at least two of something to compare, e.g. --devices oneplus-12,pixel-8-pro"
                       + (f"; {given[0]} names one" if given else ""), field=given[0] if given else "--devices")
    rows = []
    for device, strategy, calibration in combos:
        opts = {**options, **({"device": device} if device else {}), **({"strategy": strategy} if strategy else {})}
        try:
            request = run_cmd.run_request(plan=None, sets=sets, calibration=calibration, **opts)
            with request.knob_errors():
                s = request.simulate().summary
        except SimError as exc:  # a name from one of the lists: blame the list's flag, not sim run's
            flag, text = lists.get(exc.field or "", (None, None))
            if text:
                raise SimError(exc.detail, source=exc.source, field=flag) from None
            raise
        if uncertainty:
            run_cmd.add_interval(s, request, samples)
        b = (s.get("bottleneck") or {}).get("token") or {}
        rows.append({"device": s["device"], "strategy": s["strategy"], "calibration": request.calibration,
                     "decode_tokens_per_s": s["decode_tokens_per_s"],
                     "decode_tokens_per_s_ci": s["decode_tokens_per_s_ci"],
                     "decode_tokens_per_s_interval": s.get("decode_tokens_per_s_interval"),
                     "bottleneck": b.get("resource"),
                     "bottleneck_share": (b.get("shares") or {}).get(b.get("resource")),
                     "decode_tokens": request.config.decode_tokens, "warnings": request.warnings + s["warnings"]})
    if json_out:
        print(json_text(rows))
        return
    table = Table("device", "strategy", "calibration", "tokens/s", "95% CI (steady state)", "90% prediction",
                  "bottleneck", title=f"{rows[0]['decode_tokens']} decode tokens a run")
    for r in rows:
        ci, pi = r["decode_tokens_per_s_ci"], r["decode_tokens_per_s_interval"]
        table.add_row(r["device"], r["strategy"], r["calibration"], f"{r['decode_tokens_per_s']:.3g}",
                      f"[{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "-",
                      f"{pi['median']:.3g} [{pi['lo']:.3g}, {pi['hi']:.3g}]" if pi else "-",
                      f"{r['bottleneck']} ({r['bottleneck_share']:.0%})" if r["bottleneck"] else "-")
    Console(width=max(Console().width, 160)).print(table)
