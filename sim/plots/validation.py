"""Validation figures: published vs predicted values and the error per published point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from sim.plots.style import _new_axes, _require, add_caption, save_figure


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
    undrawn = df[~df.index.isin(ok.index)]
    modelled = _status(undrawn) != "not modelled"
    notes = [f"{label}: {', '.join(rows['id'])}" for label, rows in
             (("not modelled", undrawn[~modelled]), ("run failed", undrawn[modelled])) if len(rows)]
    note = f"not drawn ({'; '.join(notes)})" if notes else None
    add_caption(ax, "; ".join(t for t in (caption, note) if t))
    return ax


def plot_validation_errors(df: pd.DataFrame, *, ax: Axes | None = None, title: str | None = None,
                           caption: str | None = None) -> Axes:
    """Signed error per published point (horizontal bars), its tolerance as whiskers.

    Green bars are within the point's tolerance, red ones outside; points whose run failed
    are listed with the word ``failed`` instead of a bar, figures no run models with
    ``not modelled``.
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
    status = _status(df).to_numpy()
    for yi, e, t, st in zip(y, err, tol, status, strict=True):  # labels beyond both the bar and the whisker
        if np.isfinite(e):
            x = max(abs(e), t) * (1 if e >= 0 else -1)
            ax.annotate(f"{e:+.0f}%", (x, yi), xytext=(4 if e >= 0 else -4, 0), textcoords="offset points",
                        ha="left" if e >= 0 else "right", va="center", fontsize=6.5)
        else:
            modelled = st != "not modelled"
            ax.annotate("failed" if modelled else "not modelled", (t, yi), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=6.5, color="#c44e52" if modelled else "0.4")
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


def _status(df: pd.DataFrame) -> pd.Series:
    """Each row's ``status`` (ok, failed, not modelled); tables from before it existed count as failed."""
    return df["status"] if "status" in df.columns else pd.Series("failed", index=df.index)
