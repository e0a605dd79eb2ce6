"""Shared look of every figure: strategy colours, axis labels with units, source captions, saving.

Every figure: labelled axes with units, a legend when more than one series is drawn,
and a grey source caption at the bottom left saying where the numbers come from.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from sim.errors import SimError

STRATEGY_COLORS = {"powerinfer2": "#c44e52", "llm-in-flash": "#4c72b0", "llamacpp": "#55a868", "dense": "#8c8c8c"}
_FALLBACK_COLORS = ("#8172b3", "#937860", "#da8bc3", "#ccb974", "#64b5cd")


def strategy_color(strategy: str) -> str:
    """One colour per strategy in every figure (unknown names get a stable fallback)."""
    return STRATEGY_COLORS.get(strategy, _FALLBACK_COLORS[sum(map(ord, strategy)) % len(_FALLBACK_COLORS)])


def _new_axes(figsize: tuple[float, float]) -> Axes:
    return Figure(figsize=figsize, layout="constrained").subplots()


def add_caption(target: Axes | Figure, text: str | None) -> None:
    """A small grey line at the bottom left of the figure: the source of the plotted numbers.

    It is the figure's ``supxlabel``, so constrained layout reserves room for it under every
    panel's tick labels, and a multi-panel figure gets one caption (a second call replaces
    it). Long captions wrap to the figure's width instead of widening the layout.
    """
    if not text:
        return
    fig = target.figure if isinstance(target, Axes) else target
    width_chars = max(40, int(0.95 * fig.get_figwidth() * 72 / 3.6))  # ~3.6 pt per character at 7 pt
    fig.supxlabel(textwrap.fill(text, width=width_chars, break_on_hyphens=False), x=0.01, ha="left", fontsize=7,
                  color="0.35")


def save_figure(fig: Figure, path: str | Path, *, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG, PDF or SVG (by suffix), creating the folder."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise SimError(f"plot format must be .png, .pdf or .svg, got {path.suffix or 'no suffix'!r}",
                       source=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def _require(df: pd.DataFrame, columns: tuple[str, ...] | list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise SimError(f"{what} needs column(s) {', '.join(missing)}; got {', '.join(map(str, df.columns))}",
                       field="DataFrame")


def _compact_bytes(v: float) -> str:
    """Axis label: ``800 MB``, ``1.5 GB`` (SI units, as the papers quote memory)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} B" if v else "0"


def _bytes_formatter() -> FuncFormatter:
    return FuncFormatter(lambda v, _pos: _compact_bytes(v))


METRIC_LABELS = {"decode_tokens_per_s": "decode speed (tokens/s)", "prefill_tokens_per_s": "prefill speed (tokens/s)",
                 "latency_ms_mean": "mean latency per token (ms)", "latency_ms_p99": "p99 latency per token (ms)",
                 "cache_miss_ratio_mean": "neuron-cache miss ratio", "cache_hit_ratio": "neuron-cache hit ratio",
                 "flash_bytes_per_token": "flash bytes read per token", "energy_j_per_token": "energy per token (J)",
                 "ttft_s": "time to first token (s)"}


def metric_label(name: str) -> str:
    """Axis label with unit for a summary metric column (the column name if unknown)."""
    return METRIC_LABELS.get(name, name)
