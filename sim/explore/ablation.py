"""Ablation ladders: what each mechanism of a strategy buys, added one at a time.

[PI2] §7.5 (Fig. 14) starts from a baseline with every mechanism off and adds them one by
one, each rung keeping the ones before; [FLASH] Table 2 does the same for LLM in a Flash's
I/O. A strategy lists its mechanisms with the knob values that switch each off
(:attr:`~sim.engine.strategies.base.Strategy.mechanisms`, in its paper's order); a ladder is
a list of those names, and rung ``i`` switches the first ``i`` back on. ``sim ablate`` runs
a ladder (:func:`run_ladder`); a published point names its rung (``rung: window``) instead of
spelling the knobs (:func:`knobs_for_rung`, applied by :func:`sim.validation.load_points`),
so the command and the validation table run the same configurations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from sim.engine.busiest import busiest_resource
from sim.engine.config import RunConfig
from sim.engine.strategies import REGISTRY, get_strategy
from sim.engine.strategies.base import Strategy
from sim.errors import SimError

BASELINE = "baseline"  # the rung with every mechanism of the ladder off


def ladder_of(strategy: type[Strategy], ladder: str | Sequence[str] | None = None,
              field: str = "--ladder") -> list[str]:
    """The mechanisms of ``ladder`` (comma-separated or a list), in the order given, checked
    against the strategy's; None: all of them, in the order its paper adds them."""
    known = list(strategy.mechanisms)
    if not known:
        able = [name for name, cls in sorted(REGISTRY.items()) if cls.mechanisms]
        raise SimError(f"the {strategy.name} strategy has no mechanisms to switch; ablate one of: "
                       f"{', '.join(able)}", field="--strategy")
    if ladder is None:
        return known
    names = [n.strip() for n in ladder.split(",")] if isinstance(ladder, str) else list(ladder)
    allowed = f"{strategy.name}'s mechanisms: {', '.join(known)}"
    if not names or any(not isinstance(n, str) or not n for n in names):
        raise SimError(f"expected comma-separated mechanism names, got {ladder!r}; {allowed}", field=field)
    for name in names:
        if name not in known:
            raise SimError(f"unknown mechanism {name!r}; {allowed}", field=field)
        if names.count(name) > 1:
            raise SimError(f"names {name!r} twice; each mechanism is one rung", field=field)
    return names


def rung_knobs(strategy: type[Strategy], ladder: Sequence[str], rung: int) -> dict[str, Any]:
    """The knobs of rung ``rung`` of ``ladder`` (0: the baseline): the mechanisms after it off."""
    knobs: dict[str, Any] = {}
    for name in ladder[rung:]:
        knobs.update(strategy.mechanisms[name])
    return knobs


def rung_names(ladder: Sequence[str]) -> list[str]:
    """``baseline``, then one ``+mechanism`` per rung (the labels of [PI2] Fig. 14's bars)."""
    return [BASELINE, *(f"+{name}" for name in ladder)]


def knobs_for_rung(strategy: type[Strategy], rung: str, ladder: str | Sequence[str] | None = None,
                   field: str = "rung") -> dict[str, Any]:
    """The knobs of the rung named ``rung``: ``baseline`` or the mechanism that rung adds."""
    steps = ladder_of(strategy, ladder, field="ladder")
    names = [BASELINE, *steps]
    if rung not in names:
        raise SimError(f"unknown rung {rung!r}; the ladder's rungs: {', '.join(names)}", field=field)
    return rung_knobs(strategy, steps, names.index(rung))


def run_ladder(config: RunConfig, ladder: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Run the baseline and each rung of ``ladder`` on ``config``; one row per rung.

    Columns: ``rung``, ``mechanism`` (the one it adds; None for the baseline), ``knobs`` (the
    knobs the rung switches off), ``decode_tokens_per_s``, ``speedup`` (against the rung
    before; None for the baseline), ``speedup_total`` (against the baseline),
    ``cache_hit_ratio``, ``flash_bytes_per_token``, ``bottleneck`` and ``bottleneck_busy``
    (:func:`~sim.engine.busiest.busiest_resource`) and the run's ``warnings``. A knob the
    configuration sets that a rung switches is refused: the ladder would overrule it.
    """
    from sim.engine.simulation import simulate

    strategy = get_strategy(config.strategy)
    steps = ladder_of(strategy, ladder)
    for name in steps:
        for knob in strategy.mechanisms[name]:
            if knob in config.knobs:
                raise SimError(f"the ladder switches {knob} (mechanism {name}); drop --set {knob} or leave "
                               f"{name} out of --ladder", field=f"--set {knob}")
    rows: list[dict[str, Any]] = []
    for i, label in enumerate(rung_names(steps)):
        off = rung_knobs(strategy, steps, i)
        summary = simulate(RunConfig.of(**{**dict(config), "knobs": {**config.knobs, **off}})).summary
        tps = summary["decode_tokens_per_s"]
        resource, busy = busiest_resource(summary)
        rows.append({"rung": label, "mechanism": steps[i - 1] if i else None, "knobs": off,
                     "decode_tokens_per_s": tps,
                     "speedup": tps / rows[-1]["decode_tokens_per_s"] if rows else None,
                     "speedup_total": tps / rows[0]["decode_tokens_per_s"] if rows else 1.0,
                     "cache_hit_ratio": summary["cache_hit_ratio"],
                     "flash_bytes_per_token": summary["flash_bytes_per_token"],
                     "bottleneck": resource, "bottleneck_busy": busy, "warnings": summary.get("warnings", [])})
    return pd.DataFrame(rows)
