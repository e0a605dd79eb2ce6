"""Small in-process studies behind the notebooks and the docs figures: loops over simulate().

Each study returns tidy DataFrames (one row per run, or per token for the latency
breakdown) that :mod:`sim.plots` draws. They are deliberately plain loops: a few dozen runs
on one core, no Parquet store; large grids belong to ``sim sweep`` (:mod:`sim.explore`).

``PHONESIM_SMALL=1`` in the environment asks every study caller (notebooks, ``python -m
sim.docs``) for its small size: few tokens and few points, so CI executes them in seconds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from sim.errors import SimError

SMALL_ENV = "PHONESIM_SMALL"

RUN_COLUMNS = ("decode_tokens_per_s", "latency_ms_mean", "latency_ms_p99", "cache_miss_ratio_mean",
               "flash_bytes_per_token", "prefill_tokens_per_s")


def small_mode() -> bool:
    """True when ``PHONESIM_SMALL`` is set to anything but ``0``/empty (CI's fast path)."""
    return os.environ.get(SMALL_ENV, "").strip() not in ("", "0", "false", "no")


def pick(small: Any, full: Any) -> Any:
    """``small`` under :func:`small_mode`, else ``full`` (notebook sizes read as one line)."""
    return small if small_mode() else full


def run_configs(configs: Iterable[Mapping[str, Any]], *, labels: Iterable[str] | None = None,
                breakdown: bool = True, on_error: str = "record") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run each config (keyword arguments of :func:`~sim.engine.simulation.simulate`).

    Returns ``(runs, tokens)``: ``runs`` has one row per config (its settings, the summary
    figures of :data:`RUN_COLUMNS`, the budget in bytes and ``error`` for a run that could
    not be set up, e.g. a budget below the resident weights); ``tokens`` has the per-token
    latency breakdown (:func:`sim.plots.latency_breakdown`) of every run, tagged with its
    ``label`` and settings. ``on_error="raise"`` re-raises the first :class:`SimError`.
    """
    from sim.engine.simulation import simulate
    from sim.plots import latency_breakdown

    configs = [dict(c) for c in configs]
    names = list(labels) if labels is not None else [_label(c) for c in configs]
    if len(names) != len(configs):
        raise SimError(f"{len(names)} labels for {len(configs)} configs", field="labels")
    runs, tokens = [], []
    for label, cfg in zip(names, configs, strict=True):
        settings = {k: (v if isinstance(v, str | int | float | bool) or v is None else _name_of(v))
                    for k, v in cfg.items() if k not in ("knobs", "trace")}
        row: dict[str, Any] = {"label": label, **settings}
        try:
            result = simulate(**cfg)
        except SimError as exc:
            if on_error == "raise":
                raise
            runs.append({**row, **dict.fromkeys(RUN_COLUMNS, float("nan")), "error": str(exc)})
            continue
        s = result.summary
        row.update({k: s.get(k) for k in RUN_COLUMNS})
        row.update(device=s["device"], model=s["model"], strategy=s["strategy"],
                   memory_budget_bytes=s["memory"]["budget_bytes"],
                   ffn_resident_fraction=s["memory"]["ffn_resident_fraction"], error=None)
        runs.append(row)
        if breakdown:
            tokens.append(latency_breakdown(result.tokens, label=label, device=s["device"], model=s["model"],
                                            strategy=s["strategy"], memory_budget_bytes=row["memory_budget_bytes"]))
    return pd.DataFrame(runs), (pd.concat(tokens, ignore_index=True) if tokens else pd.DataFrame())


def budget_sweep(budgets: Iterable[str | int], strategies: Iterable[str] = ("powerinfer2", "llm-in-flash", "llamacpp"),
                 *, device: Any = "oneplus-12", model: Any = "turbosparse-mixtral-47b",
                 **run: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tokens/s against the DRAM budget for several strategies (what Fig. 10 of [PI2] plots).

    ``run`` holds further :func:`simulate` options (``decode_tokens``, ``seed`` ...).
    Returns :func:`run_configs`'s ``(runs, tokens)``; runs that cannot fit a budget carry
    the reason in ``error`` and NaN figures, so a plot simply leaves them out.
    """
    for name, values in (("budgets", budgets), ("strategies", strategies)):
        if isinstance(values, str | bytes):  # "7GB" would run the points "7", "G" and "B"
            raise SimError(f"expected a list of {name}, got the string {values!r}; wrap it in a list", field=name)
    configs, labels = [], []
    for strategy in strategies:
        for budget in budgets:
            configs.append({"device": device, "model": model, "strategy": strategy, "memory_budget": budget, **run})
            labels.append(f"{strategy}\n{budget}")
    return run_configs(configs, labels=labels)


def _name_of(value: Any) -> str:
    return str(getattr(value, "name", value))


def _label(cfg: Mapping[str, Any]) -> str:
    parts = [_name_of(cfg.get("strategy", "powerinfer2"))]
    for key in ("memory_budget", "offload", "policy"):
        if cfg.get(key) is not None:
            parts.append(f"{key}={cfg[key]}")
    return " ".join(parts)
