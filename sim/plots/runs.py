"""Figures of simulated runs: tokens/s vs memory budget, per-token latency breakdown, Gantt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from sim.plots.style import (
    _bytes_formatter,
    _new_axes,
    _require,
    add_caption,
    metric_label,
    save_figure,
    strategy_color,
)

# == tokens/s vs memory budget ===============================================================


def plot_tokens_vs_budget(runs: pd.DataFrame, published: pd.DataFrame | None = None, *,
                          metric: str = "decode_tokens_per_s", ax: Axes | None = None, title: str | None = None,
                          caption: str | None = None) -> Axes:
    """Decode speed against the DRAM budget, one line per strategy, published points on top.

    ``runs``: one row per simulated run with ``strategy``, ``memory_budget_bytes`` and
    ``metric`` (as :func:`sim.studies.budget_sweep` returns). ``published``: rows with
    ``strategy``, ``budget_bytes``, ``published`` and ``source`` (as
    :func:`sim.validation.published_frame` returns); each is drawn as a black-edged
    diamond in its strategy's colour, so the gap to the line of the same colour is the
    prediction error at that point.
    """
    _require(runs, ("strategy", "memory_budget_bytes", metric), "plot_tokens_vs_budget")
    ax = ax if ax is not None else _new_axes((7.0, 4.4))
    ok = runs[pd.to_numeric(runs[metric], errors="coerce").notna()]
    for strategy in dict.fromkeys(ok["strategy"]):
        d = ok[ok["strategy"] == strategy].sort_values("memory_budget_bytes")
        ax.plot(d["memory_budget_bytes"], d[metric], marker="o", markersize=4, linewidth=1.8,
                color=strategy_color(strategy), label=f"{strategy} (simulated)")
    if published is not None and not published.empty:
        _require(published, ("strategy", "budget_bytes", "published", "source"), "published points")
        for strategy, d in published.groupby("strategy", sort=False):
            sources = ", ".join(dict.fromkeys(d["source"]))
            ax.scatter(d["budget_bytes"], d["published"], marker="D", s=46, color=strategy_color(strategy),
                       edgecolors="black", linewidths=1.0, zorder=5, label=f"{strategy} published: {sources}")
            for r in d.itertuples(index=False):
                ax.annotate(f"{r.published:g}", (r.budget_bytes, r.published), xytext=(5, -3),
                            textcoords="offset points", fontsize=7)
    ax.xaxis.set_major_formatter(_bytes_formatter())
    ax.set_xlabel("DRAM memory budget (GB, SI)")
    ax.set_ylabel(metric_label(metric))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    if title is None and {"model", "device"} <= set(runs.columns) and len(runs):
        title = f"{runs['model'].iloc[0]} on {runs['device'].iloc[0]}: decode speed vs memory budget"
    ax.set_title(title or "Decode speed vs memory budget")
    add_caption(ax, caption)
    return ax


# == per-token latency breakdown ===========================================================

BREAKDOWN_PARTS = ("attention", "predictor", "ffn_compute", "io_stall", "other")
BREAKDOWN_LABELS = {"attention": "attention (+ router)", "predictor": "predictor", "ffn_compute": "FFN compute",
                    "io_stall": "I/O stall (flash)", "other": "LM head, memory mgmt, other"}
BREAKDOWN_COLORS = {"attention": "#4c72b0", "predictor": "#dd8452", "ffn_compute": "#55a868", "io_stall": "#8172b3",
                    "other": "#937860"}
_NOT_PHASES = ("latency_s",)


def latency_breakdown(tokens: pd.DataFrame, **labels: object) -> pd.DataFrame:
    """Split each token's latency into attention, predictor, FFN compute, I/O stall, other (ms).

    Derived from the per-token phase columns of :class:`sim.engine.simulation.SimResult`:

    - strategies that read flash *between* compute phases (LLM in a Flash, llama.cpp's page
      faults) report an ``io_s`` phase: that is the I/O stall, and ``ffn_s`` is compute;
    - strategies that overlap reads with compute (PowerInfer-2's pipeline) report one
      ``ffn_s`` phase. Its compute part is the busier of the compute threads' mean FFN
      busy time (``busy_cpu:*`` minus the barrier phases every thread runs) and the NPU's
      or GPU's busy time; the rest of ``ffn_s`` is time the FFN waited for flash (or for an
      unbalanced thread) and counts as I/O stall;
    - LM head, memory management and latency not covered by any phase (the analytic mode
      of an overlapping strategy reports none) go to ``other``.

    The parts sum to ``latency_s``. ``labels`` are added as constant columns, so several
    runs concatenate into one tidy frame for :func:`plot_latency_breakdown`.
    """
    _require(tokens, ("latency_s",), "latency_breakdown")
    cols = set(tokens.columns)
    zero = pd.Series(0.0, index=tokens.index)

    def col(name: str) -> pd.Series:
        return tokens[name].astype(float) if name in cols else zero

    phases = [c for c in tokens.columns if c.endswith("_s") and not c.startswith("busy_") and c not in _NOT_PHASES]
    attention, predictor, ffn = col("attention_s"), col("predictor_s"), col("ffn_s")
    if "io_s" in cols:
        ffn_compute, io_stall = ffn, col("io_s")
    else:
        cpu = [c for c in tokens.columns if c.startswith("busy_cpu:")]
        accel = [c for c in ("busy_npu_s", "busy_gpu_s") if c in cols]
        if cpu or accel:
            barrier = attention + predictor + col("lm_head_s") + col("memory_management_s")
            cpu_ffn = tokens[cpu].astype(float).sub(barrier, axis=0).clip(lower=0).mean(axis=1) if cpu else zero
            busiest = pd.concat([cpu_ffn, *(tokens[c].astype(float) for c in accel)], axis=1).max(axis=1)
            ffn_compute = np.minimum(busiest, ffn)
        else:
            ffn_compute = ffn
        io_stall = ffn - ffn_compute
    known = {"attention_s", "predictor_s", "ffn_s", "io_s"}
    other = sum((col(c) for c in phases if c not in known), zero)
    latency = col("latency_s")
    other = other + (latency - (attention + predictor + ffn + col("io_s") + other)).clip(lower=0)
    out = pd.DataFrame({"token": tokens["token"] if "token" in cols else np.arange(len(tokens)),
                        "latency_ms": latency * 1e3, "attention_ms": attention * 1e3,
                        "predictor_ms": predictor * 1e3, "ffn_compute_ms": ffn_compute * 1e3,
                        "io_stall_ms": io_stall * 1e3, "other_ms": other * 1e3})
    for name, value in labels.items():
        out.insert(0, name, value)
    return out


def plot_latency_breakdown(df: pd.DataFrame, by: str | list[str] = "label", *, ax: Axes | None = None,
                           title: str | None = None, caption: str | None = None, xlabel: str | None = None) -> Axes:
    """Stacked bars of mean ms per token by part, one bar per value of ``by``.

    ``df`` is the output of :func:`latency_breakdown` (several runs concatenated); bars keep
    the order in which their labels first appear, and each is topped with its total and the
    tokens/s it implies.
    """
    keys = [by] if isinstance(by, str) else list(by)
    parts = [f"{p}_ms" for p in BREAKDOWN_PARTS]
    _require(df, [*keys, *parts], "plot_latency_breakdown")
    label = df[keys].astype(str).agg("\n".join, axis=1)
    means = df[parts].groupby(label, sort=False).mean()
    ax = ax if ax is not None else _new_axes((max(7.0, 1.0 * len(means) + 5.0), 4.6))
    x = np.arange(len(means))
    bottom = np.zeros(len(means))
    for part in BREAKDOWN_PARTS:
        values = means[f"{part}_ms"].to_numpy()
        if np.any(values > 0):
            ax.bar(x, values, 0.65, bottom=bottom, color=BREAKDOWN_COLORS[part], label=BREAKDOWN_LABELS[part])
        bottom += values
    for xi, total in zip(x, bottom, strict=True):
        ax.annotate(f"{total:.0f} ms\n{1e3 / total:.2f} tok/s" if total > 0 else "0 ms", (xi, total),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, list(means.index), fontsize=8)
    ax.set_ylabel("decode latency per token (ms)")
    ax.set_xlabel(xlabel if xlabel is not None else ("run" if keys == ["label"] else " / ".join(keys)))
    ax.set_ylim(0, float(bottom.max()) * 1.18 + 1e-9)
    ax.grid(True, axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or "Where a decode token's time goes")
    add_caption(ax, caption)
    return ax


# == timeline Gantt =========================================================================

SPAN_COLORS = {"attention": "#4c72b0", "predictor": "#dd8452", "gate": "#55a868", "up-down": "#8fd19e",
               "ffn-hot": "#c44e52", "gate-read": "#8172b3", "updown-read": "#b7a8e0", "lm_head": "#937860",
               "prefill": "#da8bc3", "prefetch": "#8c8c8c", "load": "#8172b3", "compute": "#55a868",
               "fault": "#8172b3", "ffn": "#55a868", "memcpy": "#ccb974"}


def spans_frame(spans: object) -> pd.DataFrame:
    """Timeline spans (``SimResult.spans``) as a tidy frame: unit, name, start/end ms, token."""
    if isinstance(spans, pd.DataFrame):
        _require(spans, ("unit", "name", "start_ms", "end_ms", "token"), "spans_frame")
        return spans
    rows = [(s.unit, s.name, s.start_s * 1e3, s.end_s * 1e3, s.token) for s in spans]  # type: ignore[attr-defined]
    return pd.DataFrame(rows, columns=["unit", "name", "start_ms", "end_ms", "token"])


def plot_gantt(spans: object, *, first_token: int = 0, n_tokens: int = 1, ax: Axes | None = None,
               title: str | None = None, caption: str | None = None) -> Axes:
    """Gantt chart of decode tokens ``first_token .. first_token + n_tokens - 1``: a row per unit.

    ``spans`` is ``SimResult.spans`` (run with ``timeline=True``) or :func:`spans_frame`'s
    output. Rows are the compute threads, the NPU/GPU, the I/O threads and the storage
    queue, so gaps in the CPU rows while the storage row is busy are I/O stalls. When no
    decode token is in range (a prefill-only run), the first 2000 spans are drawn.
    """
    from sim.engine.timeline import _unit_order

    df = spans_frame(spans)
    shown = df[(df["token"] >= first_token) & (df["token"] < first_token + n_tokens)]
    if shown.empty:
        shown = df.head(2000)
    units = sorted(shown["unit"].unique(), key=_unit_order)
    ax = ax if ax is not None else _new_axes((11.0, 0.42 * len(units) + 1.9))
    t0 = float(shown["start_ms"].min()) if len(shown) else 0.0
    for row, unit in enumerate(units):
        d = shown[shown["unit"] == unit]
        ax.broken_barh(list(zip(d["start_ms"] - t0, d["end_ms"] - d["start_ms"], strict=True)), (row - 0.4, 0.8),
                       facecolors=[SPAN_COLORS.get(n, "#999999") for n in d["name"]], linewidth=0)
    ax.set_yticks(range(len(units)), units, fontsize=8)
    ax.set_ylim(len(units) - 0.5, -0.5)
    ax.set_xlabel("simulated time since the first shown span (ms)")
    ax.set_ylabel("unit (thread / queue)")
    names = [n for n in SPAN_COLORS if n in set(shown["name"])]
    names += sorted(set(shown["name"]) - set(SPAN_COLORS))
    if names:
        from matplotlib.patches import Patch

        ax.legend([Patch(color=SPAN_COLORS.get(n, "#999999")) for n in names], names, fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), title="span", title_fontsize=7)
    if title is None:
        last = first_token + n_tokens - 1
        which = f"decode token {first_token}" if n_tokens == 1 else f"decode tokens {first_token}-{last}"
        title = f"Timeline of {which}: compute, I/O and storage activity"
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    add_caption(ax, caption)
    return ax


def draw_gantt(spans: object, path: str | Path, *, tokens: int = 2) -> Path:
    """A Gantt chart PNG of the first ``tokens`` decode tokens (``sim run --gantt``).

    :func:`plot_gantt` is the one Gantt implementation (the notebooks and ``python -m
    sim.docs`` use it too); this keeps the CLI a one-liner.
    """
    ax = plot_gantt(spans, first_token=0, n_tokens=tokens)
    return save_figure(ax.figure, path, dpi=110)
