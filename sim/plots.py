"""Matplotlib figures used by the CLI and notebooks; each takes a tidy DataFrame.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot), so plotting
from the CLI or a test never depends on a display or changes global backend state.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from sim.errors import SimError
from sim.units import parse_bytes

# -- cache-policy comparison ---------------------------------------------------------------
_CACHE_ORDER = ("lru", "fifo", "lfu", "clock", "s3fifo", "sieve", "arc", "static-hot", "window",
                "pi2-segmented", "belady")
_CACHE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf", "#000000")


def _cache_style(policy: str) -> dict:
    """Same colour for a policy in every figure; Belady (the offline bound) dashed black."""
    if policy in _CACHE_ORDER:
        color = _CACHE_COLORS[_CACHE_ORDER.index(policy)]
    else:
        color = _CACHE_COLORS[sum(map(ord, policy)) % (len(_CACHE_COLORS) - 1)]
    style = {"color": color, "marker": "o", "markersize": 3.5, "linewidth": 1.6, "label": policy}
    if policy == "belady":
        style.update(linestyle="--", marker=None, linewidth=1.8, label="belady (offline bound)")
    return style


def _policies_in_order(df: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(df["policy"]))
    return [p for p in _CACHE_ORDER if p in present] + [p for p in present if p not in _CACHE_ORDER]


def _compact_bytes(v: float) -> str:
    """Axis label: ``800 MB``, ``1.5 GB`` (SI units, as the papers quote memory)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} B" if v else "0"


def _bytes_formatter() -> FuncFormatter:
    return FuncFormatter(lambda v, _pos: _compact_bytes(v))


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


# == shared style ==========================================================================
# Every figure below: labelled axes with units, a legend when more than one series is drawn,
# and a grey source caption at the bottom left saying where the numbers come from.

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


# == sweep heatmap ==========================================================================


METRIC_LABELS = {"decode_tokens_per_s": "decode speed (tokens/s)", "prefill_tokens_per_s": "prefill speed (tokens/s)",
                 "latency_ms_mean": "mean latency per token (ms)", "latency_ms_p99": "p99 latency per token (ms)",
                 "cache_miss_ratio_mean": "neuron-cache miss ratio", "cache_hit_ratio": "neuron-cache hit ratio",
                 "flash_bytes_per_token": "flash bytes read per token", "energy_j_per_token": "energy per token (J)",
                 "ttft_s": "time to first token (s)"}


def metric_label(name: str) -> str:
    """Axis label with unit for a summary metric column (the column name if unknown)."""
    return METRIC_LABELS.get(name, name)


def _ordered_levels(values: pd.Series) -> list[object]:
    """Distinct axis values in a natural order: by number, by byte size, else first seen."""
    levels = list(dict.fromkeys(values.tolist()))
    numeric = pd.to_numeric(pd.Series(levels, dtype=object), errors="coerce")
    if len(levels) and not numeric.isna().any():
        return [levels[i] for i in np.argsort(numeric.to_numpy(dtype=float), kind="stable")]
    if all(isinstance(v, str) for v in levels):
        try:
            sizes = [parse_bytes(v) for v in levels]
        except SimError:
            return levels
        return [levels[i] for i in np.argsort(sizes, kind="stable")]
    return levels


def plot_sweep_heatmap(df: pd.DataFrame, x: str, y: str, value: str = "decode_tokens_per_s", *,
                       agg: str = "mean", ax: Axes | None = None, title: str | None = None,
                       caption: str | None = None, cmap: str = "viridis") -> Axes:
    """A metric over two sweep axes: one annotated cell per (x, y), ``agg`` over the rest.

    ``df`` is tidy: axis columns plus metric columns, one row per run (a sweep's results;
    rows whose ``status`` is not ``ok`` are left out). Several rows in one cell (seeds, or
    axes not shown) are combined with ``agg`` (``mean``, ``min``, ``max``, ``median``).
    Numeric axes and sizes such as ``8GB`` are ordered by value, other labels as first seen.
    """
    _require(df, (x, y, value), "plot_sweep_heatmap")
    data = df[df["status"] == "ok"] if "status" in df.columns else df
    if data.empty:
        raise SimError("no successful rows to plot", field=value)
    data = data.assign(_v=pd.to_numeric(data[value], errors="coerce"), _x=data[x].astype(object),
                       _y=data[y].astype(object))
    xs, ys = _ordered_levels(data["_x"]), _ordered_levels(data["_y"])
    grid = data.groupby(["_y", "_x"], sort=False)["_v"].agg(agg).unstack("_x").reindex(index=ys, columns=xs)
    values = grid.to_numpy(dtype=float)
    ax = ax if ax is not None else _new_axes((max(4.5, 1.0 * len(xs) + 2.6), max(3.2, 0.55 * len(ys) + 1.9)))
    img = ax.imshow(values, aspect="auto", origin="lower", cmap=cmap)
    several = bool(data.groupby(["_y", "_x"], sort=False).size().gt(1).any())
    ax.figure.colorbar(img, ax=ax, label=metric_label(value) + (f", {agg} per cell" if several else ""))
    tilt = len(xs) > 5
    ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=30 if tilt else 0, ha="right" if tilt else "center",
                  fontsize=8)
    ax.set_yticks(range(len(ys)), [str(v) for v in ys], fontsize=8)
    finite = values[np.isfinite(values)]
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        norm = (values - lo) / (hi - lo) if hi > lo else np.full_like(values, 0.5)
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                if np.isfinite(values[i, j]):
                    ax.text(j, i, f"{values[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color="black" if norm[i, j] > 0.55 else "white")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or f"{metric_label(value)} over {x} x {y}")
    add_caption(ax, caption)
    return ax


# == validation: published vs predicted =====================================================


def _metric_family(metric: str) -> str:
    if metric.endswith("tokens_per_s"):
        return "tokens/s"
    if "miss_ratio" in metric or "hit_ratio" in metric:
        return "cache miss ratio"
    if metric.startswith("phase_ms.") or metric.endswith("_ms_mean") or "_ms_" in metric:
        return "ms per token"
    return metric


_FAMILY_MARKERS = {"tokens/s": "o", "ms per token": "s", "cache miss ratio": "^"}


def plot_published_vs_predicted(df: pd.DataFrame, *, ax: Axes | None = None, title: str | None = None,
                                caption: str | None = None) -> Axes:
    """Predicted against published on log-log axes: the diagonal is a perfect prediction.

    ``df`` is :func:`sim.validation.validate`'s output. The grey band is the default
    ±15% tolerance; marker shape is the metric's unit and colour its source paper, so one
    picture holds tokens/s, ms and miss ratios (the ratio to the diagonal is unit-free).
    """
    _require(df, ("id", "source", "metric", "published", "predicted"), "plot_published_vs_predicted")
    ax = ax if ax is not None else _new_axes((6.4, 5.6))
    ok = df[pd.to_numeric(df["predicted"], errors="coerce").gt(0) & df["published"].gt(0)]
    paper = df["source"].str.extract(r"^\[(\w+)\]")[0].fillna(df["source"])
    papers = list(dict.fromkeys(paper))
    paper_colors = dict(zip(papers, ("#c44e52", "#4c72b0", "#55a868", "#8172b3", "#937860"), strict=False))
    for (fam, src), d in ok.groupby([ok["metric"].map(_metric_family), paper[ok.index]], sort=False):
        ax.scatter(d["published"], d["predicted"], marker=_FAMILY_MARKERS.get(fam, "D"), s=34,
                   color=paper_colors.get(src, "#999999"), edgecolors="black", linewidths=0.5, zorder=4,
                   label=f"[{src}] {fam}")
        for r in d.itertuples(index=False):
            ax.annotate(r.id, (r.published, r.predicted), xytext=(4, 2), textcoords="offset points", fontsize=5.5,
                        color="0.25")
    if len(ok):
        lo = float(min(ok["published"].min(), ok["predicted"].min())) / 1.6
        hi = float(max(ok["published"].max(), ok["predicted"].max())) * 1.6
        line = np.geomspace(lo, hi, 50)
        ax.plot(line, line, color="black", linewidth=1.0, linestyle="--", label="predicted = published")
        ax.fill_between(line, line * 0.85, line * 1.15, color="0.6", alpha=0.25, label="±15% (default tolerance)")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("published value (tokens/s, ms per token or miss ratio)")
    ax.set_ylabel("predicted value (same unit)")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title or "Published vs predicted")
    failed = df[~df.index.isin(ok.index)]
    note = f"not drawn (run failed): {', '.join(failed['id'])}" if len(failed) else None
    add_caption(ax, "; ".join(t for t in (caption, note) if t))
    return ax


def plot_validation_errors(df: pd.DataFrame, *, ax: Axes | None = None, title: str | None = None,
                           caption: str | None = None) -> Axes:
    """Signed error per published point (horizontal bars), its tolerance as whiskers.

    Green bars are within the point's tolerance, red ones outside; points whose run failed
    are listed with the word ``failed`` instead of a bar.
    """
    _require(df, ("id", "source", "error_pct"), "plot_validation_errors")
    n = len(df)
    ax = ax if ax is not None else _new_axes((7.6, 0.28 * n + 1.8))
    y = np.arange(n)
    err = pd.to_numeric(df["error_pct"], errors="coerce").to_numpy(dtype=float)
    tol = (pd.to_numeric(df["tolerance_pct"], errors="coerce").fillna(15.0).to_numpy(dtype=float)
           if "tolerance_pct" in df.columns else np.full(n, 15.0))
    inside = np.abs(err) <= tol
    colors = np.where(inside, "#55a868", "#c44e52")
    ax.barh(y, np.nan_to_num(err), color=colors, height=0.65)
    ax.errorbar(np.zeros(n), y, xerr=tol, fmt="none", ecolor="0.3", elinewidth=0.8, capsize=3,
                label="tolerance of the point")
    for yi, e, t in zip(y, err, tol, strict=True):  # labels beyond both the bar and the whisker
        if np.isfinite(e):
            x = max(abs(e), t) * (1 if e >= 0 else -1)
            ax.annotate(f"{e:+.0f}%", (x, yi), xytext=(4 if e >= 0 else -4, 0), textcoords="offset points",
                        ha="left" if e >= 0 else "right", va="center", fontsize=6.5)
        else:
            ax.annotate("failed", (t, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=6.5,
                        color="#c44e52")
    labels = [f"{i}  {s}" for i, s in zip(df["id"], df["source"], strict=True)]
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_ylim(n - 0.5, -0.5)
    ax.axvline(0, color="black", linewidth=0.8)
    finite = err[np.isfinite(err)]
    span = max(float(np.abs(finite).max()) if finite.size else 0.0, float(tol.max()) if n else 15.0) * 1.25
    ax.set_xlim(-span, span)
    ax.set_xlabel("prediction error (% of the published value)")
    ax.grid(True, axis="x", alpha=0.3)
    from matplotlib.patches import Patch

    handles = [Patch(color="#55a868", label="within tolerance"), Patch(color="#c44e52", label="outside tolerance")]
    handles.append(ax.get_legend_handles_labels()[0][0])
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.set_title(title or "Prediction error per published figure")
    add_caption(ax, caption)
    return ax


def write_validation_plots(df: pd.DataFrame, out_dir: str | Path, *, caption: str | None = None) -> list[Path]:
    """``sim validate --plot DIR``: the error bars and the published-vs-predicted scatter."""
    out = Path(out_dir)
    errors = plot_validation_errors(df, caption=caption)
    scatter = plot_published_vs_predicted(df, caption=caption)
    return [save_figure(errors.figure, out / "validation_errors.png"),
            save_figure(scatter.figure, out / "published_vs_predicted.png")]
