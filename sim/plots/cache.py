"""Cache-policy comparison: miss ratio and flash bytes per token against the cache size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.cache import POLICIES, POLICY_NAMES
from sim.plots.style import _bytes_formatter, add_caption

_CACHE_ORDER = POLICY_NAMES  # one order for help texts, comparisons and plots: sim.cache's
_CACHE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf", "#000000")


def _cache_style(policy: str) -> dict:
    """Same colour for a policy in every figure; an offline bound (Belady: it needs the future) dashed black."""
    if policy in _CACHE_ORDER:
        color = _CACHE_COLORS[_CACHE_ORDER.index(policy)]
    else:
        color = _CACHE_COLORS[sum(map(ord, policy)) % (len(_CACHE_COLORS) - 1)]
    style = {"color": color, "marker": "o", "markersize": 3.5, "linewidth": 1.6, "label": policy}
    if policy in POLICIES and POLICIES[policy].needs_future:
        style.update(linestyle="--", marker=None, linewidth=1.8, label=f"{policy} (offline bound)")
    return style


def _policies_in_order(df: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(df["policy"]))
    return [p for p in _CACHE_ORDER if p in present] + [p for p in present if p not in _CACHE_ORDER]


def _maybe_log_x(ax: Axes, values: np.ndarray) -> None:
    values = values[values > 0]
    if values.size > 1 and values.max() / values.min() >= 50:
        ax.set_xscale("log")


def plot_miss_ratio_curves(df: pd.DataFrame, ax: Axes | None = None, *, caption: str | None = None) -> Axes:
    """Miss ratio vs cache size, one line per policy, Belady dashed.

    The x axis is the capacity as a percentage of all item bytes when ``capacity_pct``
    is known, otherwise bytes.
    """
    if ax is None:
        ax = Figure(figsize=(6.4, 4.4)).subplots()
    use_pct = "capacity_pct" in df and df["capacity_pct"].notna().all()
    xcol = "capacity_pct" if use_pct else "capacity_bytes"
    for policy in _policies_in_order(df):
        d = df[df["policy"] == policy].sort_values(xcol)
        ax.plot(d[xcol], d["miss_ratio"], **_cache_style(policy))
    _maybe_log_x(ax, df[xcol].to_numpy(dtype=float))
    if use_pct:
        ax.set_xlabel("cache size (% of FFN / item bytes)")
    else:
        ax.set_xlabel("cache size")
        ax.xaxis.set_major_formatter(_bytes_formatter())
    ax.set_ylabel("miss ratio (neuron requests)")
    ax.set_ylim(0, min(1.0, float(df["miss_ratio"].max()) * 1.05 + 0.02))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Miss ratio vs cache size")
    add_caption(ax, caption)
    return ax


def plot_flash_bytes_per_token(df: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Bytes read from flash per token vs the DRAM given to the neuron cache."""
    if ax is None:
        ax = Figure(figsize=(6.4, 4.4)).subplots()
    for policy in _policies_in_order(df):
        d = df[df["policy"] == policy].sort_values("capacity_bytes")
        ax.plot(d["capacity_bytes"], d["flash_bytes_per_token"], **_cache_style(policy))
    _maybe_log_x(ax, df["capacity_bytes"].to_numpy(dtype=float))
    ax.xaxis.set_major_formatter(_bytes_formatter())
    ax.yaxis.set_major_formatter(_bytes_formatter())
    ax.set_xlabel("DRAM budget for the neuron cache")
    ax.set_ylabel("flash bytes read per token")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Flash traffic vs DRAM budget")
    return ax


def plot_cache_comparison(df: pd.DataFrame, path: str | Path | None = None, *, title: str | None = None,
                          caption: str | None = None) -> Figure:
    """Both cache figures side by side (the output of ``sim cache compare --plot``)."""
    fig = Figure(figsize=(12.5, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    plot_miss_ratio_curves(df, left)
    plot_flash_bytes_per_token(df, right)
    if title:
        fig.suptitle(title)
    add_caption(fig, caption)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=130)
    return fig
