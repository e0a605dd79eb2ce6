"""Matplotlib figures used by the CLI and notebooks; each takes a tidy DataFrame.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot), so plotting
from the CLI or a test never depends on a display or changes global backend state.

One module per job: :mod:`~sim.plots.style` (colours, labels, captions, saving),
:mod:`~sim.plots.ablation` (an ablation ladder's bars), :mod:`~sim.plots.cache` (cache-policy
comparison), :mod:`~sim.plots.runs` (tokens/s vs
budget, latency breakdown, Gantt), :mod:`~sim.plots.sweeps` (sweep heatmap) and
:mod:`~sim.plots.validation` (published vs predicted). Import figures from ``sim.plots``;
:mod:`~sim.plots.sweep_lines` (a sweep metric against one axis, for ``sim sweep plot``) is
imported from its module.
"""

from __future__ import annotations

from sim.plots.ablation import draw_ablation, plot_ablation
from sim.plots.cache import plot_cache_comparison, plot_flash_bytes_per_token, plot_miss_ratio_curves
from sim.plots.runs import (
    BREAKDOWN_COLORS,
    BREAKDOWN_LABELS,
    BREAKDOWN_PARTS,
    SPAN_COLORS,
    draw_gantt,
    latency_breakdown,
    plot_gantt,
    plot_latency_breakdown,
    plot_tokens_vs_budget,
    spans_frame,
)
from sim.plots.style import METRIC_LABELS, STRATEGY_COLORS, add_caption, metric_label, save_figure, strategy_color
from sim.plots.sweeps import plot_sweep_heatmap
from sim.plots.validation import plot_published_vs_predicted, plot_validation_errors, write_validation_plots

__all__ = [
    "BREAKDOWN_COLORS",
    "BREAKDOWN_LABELS",
    "BREAKDOWN_PARTS",
    "METRIC_LABELS",
    "SPAN_COLORS",
    "STRATEGY_COLORS",
    "add_caption",
    "draw_ablation",
    "draw_gantt",
    "latency_breakdown",
    "metric_label",
    "plot_ablation",
    "plot_cache_comparison",
    "plot_flash_bytes_per_token",
    "plot_gantt",
    "plot_latency_breakdown",
    "plot_miss_ratio_curves",
    "plot_published_vs_predicted",
    "plot_sweep_heatmap",
    "plot_tokens_vs_budget",
    "plot_validation_errors",
    "save_figure",
    "spans_frame",
    "strategy_color",
    "write_validation_plots",
]
