"""Fit the synthetic generator's parameters to a recorded trace.

The fitted parameters are width-free (fractions, rank-fraction curves, per-token
correlations; see :mod:`sim.traces.params`), so a fit on the 6-layer, 1536-neuron MiniLM
trace drives a 32-layer, 8 x 14336-neuron Mixtral. Per layer:

- ``density``: the measured mean.
- ``propensity``: each neuron's activation frequency is a noisy estimate of its
  propensity (binomial noise inflated by temporal correlation). The frequencies are
  shrunk towards the mean by the factor that removes that noise variance (a moment
  deconvolution), sorted, and stored as logit values at fixed rank fractions. Without the
  shrinkage a regenerated trace would carry the noise twice and look more skewed.
- ``persistence``: dense models: the value whose Markov-chain prediction of the sliding
  window curve (``window_new_share`` for k = 1..10, closed form) best matches the trace
  in log terms; MoE: from the overlap between consecutive uses of the same expert.
- ``routing`` (MoE): expert shares, and the set persistence that reproduces the measured
  mean expert overlap of consecutive tokens.
- ``predictor`` (if the trace has predicted sets): recall and precision per layer, and
  the false-positive chain's persistence reproducing the predicted sets' overlap.
- ``drift`` (context shifts, see :func:`sim.traces.fit_drift.fit_drift`): how fast a static hot set goes stale
  gives ``rate * share`` (the share of neurons re-drawn per token); how much reference
  windows disagree about it (a few big shifts or many small ones) splits it.
  Drift also blurs the long-run activation frequencies the propensity fit sees, so the
  deconvolution undoes that blur (the time average of a propensity that is re-drawn at
  rate ``k`` per token over ``T`` tokens keeps ``2 (kT - 1 + e^-kT) / (kT)^2`` of its
  variance).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SimError
from sim.traces.fit_drift import DRIFT_WINDOW, fit_drift
from sim.traces.format import Trace
from sim.traces.params import params_from_mapping
from sim.traces.stats import K_MAX, trace_stats
from sim.traces.synth import _false_positive_propensity, solve_propensities

RANK_KNOTS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3,
              0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
_EPS = 1e-6


def _counts(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Activations per (layer, expert * n + neuron) and rows per (layer, expert)."""
    m = trace.meta
    n_keys = m.n_experts * m.n_neurons
    counts = np.zeros(m.n_layers * n_keys, np.int64)
    uses = np.zeros((m.n_layers, m.n_experts), np.int64)
    for chunk in trace.chunks():
        lengths = np.diff(chunk.offsets)
        rows = np.repeat(np.arange(lengths.size), lengths)
        layer = (rows // m.top_k) % m.n_layers
        expert = chunk.experts.reshape(-1).astype(np.int64)
        key = layer * n_keys + expert[rows] * m.n_neurons + chunk.ids
        counts += np.bincount(key, minlength=counts.size)
        layer_of_row = np.broadcast_to(np.arange(m.n_layers)[None, :, None], chunk.experts.shape)
        np.add.at(uses, (layer_of_row.reshape(-1), expert), 1)
    return counts.reshape(m.n_layers, n_keys), uses


def _model_new_share(p: np.ndarray, r: float) -> np.ndarray:
    """Closed-form window_new_share[k], k = 1..K_MAX, of independent sticky chains (per neuron)."""
    k = np.arange(1, K_MAX + 1)[:, None]
    return (p * r * (1 - p) * (1 - r * p) ** (k - 1)).mean(axis=1)


def _summary(p: np.ndarray, size: int = 1024) -> np.ndarray:
    """Evenly spaced order statistics of p: means over neurons, cheaply, at any width."""
    if p.size <= size:
        return p
    srt = np.sort(p)
    return srt[((np.arange(size) + 0.5) * p.size / size).astype(np.int64)]


def _fit_refresh_window(p: np.ndarray, observed: np.ndarray) -> float:
    """Refresh rate r = 1 - persistence minimising the log error of the window curve."""
    obs = np.maximum(observed, 1e-12)
    p = _summary(p)
    grid = np.linspace(0.002, 1.0, 100)
    errs = [float(np.sum(np.log(np.maximum(_model_new_share(p, r), 1e-12) / obs) ** 2)) for r in grid]
    best = int(np.argmin(errs))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    for _ in range(30):  # golden-section refinement
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        fa = np.sum(np.log(np.maximum(_model_new_share(p, a), 1e-12) / obs) ** 2)
        fb = np.sum(np.log(np.maximum(_model_new_share(p, b), 1e-12) / obs) ** 2)
        if fa < fb:
            hi = b
        else:
            lo = a
    return float(0.5 * (lo + hi))


def _refresh_from_overlap(p: np.ndarray, overlap: float) -> float:
    """r such that E|A_t & A_t-1| / E|A_t| = overlap for sticky chains with propensities p."""
    s1, s2 = p.sum(), (p * p).sum()
    spread = (p * (1 - p)).sum()
    if spread <= 0:
        return 1.0
    keep = (overlap * s1 - s2) / spread  # = 1 - r
    return float(np.clip(1.0 - keep, 0.001, 1.0))


def drift_variance_kept(decay_per_token: float, n_tokens: int) -> float:
    """Share of a propensity's variance left in its average over ``n_tokens`` under drift.

    A propensity re-drawn at rate ``k`` per token has autocorrelation ``exp(-k |lag|)``;
    the variance of its time average over ``T`` tokens is ``2 (x - 1 + e^-x) / x^2`` of
    the variance (``x = k T``), 1 without drift.
    """
    x = float(decay_per_token) * float(n_tokens)
    if x < 1e-6:
        return 1.0
    return float(2.0 * (x - 1.0 + np.exp(-x)) / (x * x))


def _deconvolve(freq: np.ndarray, n_obs: np.ndarray, density: float, refresh: float,
                drift_kept: float = 1.0) -> np.ndarray:
    """Shrink observed frequencies towards the mean by the share of variance that is noise.

    ``drift_kept`` (see :func:`drift_variance_kept`) then widens them again by the
    variance that context shifts averaged away, so the shape is the propensities' at one
    moment: in logit space (a linear stretch in probability space would push every rarely
    seen neuron below zero), by the factor that divides their variance by ``drift_kept``.
    """
    persistence = 1.0 - refresh
    inflation = (1 + persistence) / max(1 - persistence, 1e-3)
    noise = float(np.mean(freq * (1 - freq) / np.maximum(n_obs, 1))) * inflation
    var = float(np.var(freq))
    shrink = np.sqrt(max(0.0, 1.0 - noise / var)) if var > 0 else 0.0
    mean = float(freq.mean())
    p = np.clip(density + shrink * (freq - mean), _EPS, 1 - _EPS)
    if drift_kept >= 1.0 or np.var(p) <= 0:
        return p
    logit = np.log(p / (1 - p))
    shape = logit - np.median(logit)
    target = float(np.var(p)) / max(drift_kept, 1e-3)
    lo, hi = 1.0, 1.0
    while float(np.var(solve_propensities(hi * shape, density))) < target and hi < 64:
        lo, hi = hi, 2 * hi
    for _ in range(40):  # the variance grows with the stretch: bisect
        mid = 0.5 * (lo + hi)
        if float(np.var(solve_propensities(mid * shape, density))) < target:
            lo = mid
        else:
            hi = mid
    return np.clip(solve_propensities(0.5 * (lo + hi) * shape, density), _EPS, 1 - _EPS)


def _shape_knots(p: np.ndarray) -> list[float]:
    srt = np.sort(p)[::-1]
    logit = np.log(srt / (1 - srt))
    pos = (np.arange(srt.size) + 0.5) / srt.size
    vals = np.interp(RANK_KNOTS, pos, logit)
    vals = np.minimum.accumulate(vals)  # non-increasing, hottest first
    return [round(float(v), 4) for v in vals]


def _predicted_overlap(p: np.ndarray, z: np.ndarray, recall: float, r: float, rz: float) -> float:
    """E|P_t & P_t-1| / E|P_t| for predicted = (active & kept) | (false-positive chain & ~active)."""
    paa = p * (1 - r + r * p)
    pa0 = p - paa
    p00 = 1 - 2 * p + paa
    pzz = z * (1 - rz + rz * z)
    both = recall**2 * paa + 2 * recall * pa0 * z + p00 * pzz
    return float(both.sum() / max((recall * p + (1 - p) * z).sum(), 1e-12))


def _fit_fp_refresh(p: np.ndarray, z: np.ndarray, recall: float, r: float, target: float) -> float:
    """False-positive chain refresh rate reproducing the predicted sets' t / t-1 overlap.

    The overlap falls as the refresh rate rises, so bisection finds it.
    """
    lo, hi = 0.001, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if _predicted_overlap(p, z, recall, r, mid) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _fit_layers(counts: np.ndarray, uses: np.ndarray, stats: dict[str, Any], n_e: int, n: int,
                drift_kept: float) -> tuple[list[float], list[float], list[list[float]], list[np.ndarray]]:
    """Density, refresh rate, propensity shape and deconvolved propensities per layer."""
    density = np.asarray(stats["density"], dtype=np.float64)
    densities, refreshes, shapes, p_layers = [], [], [], []
    for layer in range(density.size):
        n_obs = np.repeat(uses[layer], n)  # observations of each (expert, neuron) key
        used = n_obs > 0
        freq = counts[layer][used] / n_obs[used]
        d = float(np.clip(density[layer], _EPS, 1 - _EPS))
        p = np.clip(freq, _EPS, 1 - _EPS)
        refresh = 1.0
        for _ in range(3):  # persistence and deconvolution depend on each other; iterate
            if n_e == 1:
                observed = np.asarray(stats["window_new_share_per_layer"][layer][1:], dtype=np.float64)
                refresh = _fit_refresh_window(p, observed)
            else:
                refresh = _refresh_from_overlap(p, float(stats["overlap_same_expert_per_layer"][layer]))
            p = _deconvolve(freq, n_obs[used], d, refresh, drift_kept)
        densities.append(round(d, 6))
        refreshes.append(refresh)
        shapes.append(_shape_knots(p))
        p_layers.append(p)
    return densities, refreshes, shapes, p_layers


def fit_params(trace: Trace, *, name: str | None = None, source_label: str | None = None,
               stats: dict[str, Any] | None = None, drift: bool = True) -> dict[str, Any]:
    """Estimate generator parameters from ``trace``; returns the YAML-ready mapping.

    ``drift=False`` skips the context-shift fit (no ``drift`` group, frequencies taken as
    stationary).
    """
    meta = trace.meta
    if meta.n_tokens < 8:
        raise SimError(f"needs at least 8 tokens to fit, the trace has {meta.n_tokens}",
                       source=source_label or str(trace.path or "<trace>"))
    stats = stats or trace_stats(trace)
    counts, uses = _counts(trace)
    n_l, n_e, n = meta.n_layers, meta.n_experts, meta.n_neurons
    densities, refreshes, shapes, p_layers = _fit_layers(counts, uses, stats, n_e, n, 1.0)
    drift_fit = None
    if drift and meta.n_tokens >= 4 * DRIFT_WINDOW:
        drift_fit = fit_drift(trace, refresh=np.asarray(refreshes))
        if drift_fit["rate"] > 0:  # undo the blur drift put on the long-run frequencies
            kept = drift_variance_kept(drift_fit["decay_per_token"], meta.n_tokens)
            densities, refreshes, shapes, p_layers = _fit_layers(counts, uses, stats, n_e, n, kept)
    label = source_label or (str(trace.path) if trace.path else "<in-memory trace>")
    raw: dict[str, Any] = {
        "name": name or f"fitted-{meta.model}",
        "description": f"Fitted by `sim trace fit` from {label} ({meta.n_tokens} tokens, {meta.source}).",
        "made_for": {"model": meta.model, "n_layers": n_l, "n_neurons": n, "hidden": meta.hidden,
                     "n_experts": n_e, "top_k": meta.top_k},
        "density": {"value": densities, "fitted": f"measured per layer in {label}"},
        "propensity": {"dist": "empirical", "rank": list(RANK_KNOTS), "logit": shapes,
                       "fitted": "per-neuron frequencies, noise-deconvolved, as logit at rank fractions"},
        "persistence": {"value": [round(1.0 - r, 4) for r in refreshes],
                        "fitted": ("sliding-window curve k=1..10 (Markov closed form)" if n_e == 1 else
                                   "overlap of consecutive uses of the same expert")},
    }
    if drift_fit is not None:
        raw["drift"] = {"rate": round(drift_fit["rate"], 5), "share": round(drift_fit["share"], 4),
                        "fitted": _drift_note(drift_fit)}
    if n_e > 1:
        pop = np.asarray(stats["experts"]["popularity"], dtype=np.float64)
        pers = np.asarray(stats["experts"]["persistence"], dtype=np.float64)
        base = ((meta.top_k * pop) ** 2).sum(axis=1) / meta.top_k
        route = np.clip((pers - base) / np.maximum(1 - base, 1e-9), 0.0, 0.99)
        raw["routing"] = {"popularity": [[round(float(x), 5) for x in row] for row in pop],
                          "persistence": [round(float(x), 4) for x in route],
                          "fitted": "expert shares and consecutive-token expert overlap"}
    if meta.has_predictions and "predicted" in stats:
        ps = stats["predicted"]
        recall = np.clip(np.asarray(ps["recall"], dtype=np.float64), 0.0, 1.0)
        precision = np.clip(np.asarray(ps["precision"], dtype=np.float64), 1e-4, 1.0)
        fp_pers = []
        for layer in range(n_l):
            p = p_layers[layer]
            p = _summary(p)
            z = _false_positive_propensity(p, float(recall[layer]), float(precision[layer]), None, 1.0)
            target = float(ps["overlap_same_expert_per_layer"][layer]) if n_e > 1 else \
                float(ps["overlap_per_layer"][layer])
            rz = _fit_fp_refresh(p, z, float(recall[layer]), refreshes[layer], target)
            fp_pers.append(round(1.0 - rz, 4))
        raw["predictor"] = {"recall": [round(float(x), 4) for x in recall],
                            "precision": [round(float(x), 4) for x in precision],
                            "fp_skew": 1.0, "fp_persistence": fp_pers,
                            "fitted": "recall/precision per layer; false-positive persistence from the "
                                      "predicted sets' overlap; fp_skew assumed 1 (errors on popular neurons)"}
    params_from_mapping(raw, label)  # validate what we produce
    return raw


def _drift_note(fit: dict[str, Any]) -> str:
    lo, hi = fit["fit_distances"]
    decay = (f"a static hot set's coverage decays {fit['decay_per_token']:.4f}/token "
             f"(SE {fit['decay_se']:.4f}) over distances {lo}-{hi}")
    if not fit["significant"]:
        return f"no drift: {decay}, not beyond noise"
    return (f"{decay} (= rate x share); the spread between windows gives share {fit['share']:.3f} "
            f"(upper {fit['share_upper']:.3f}); {fit['n_events']} shifts visible one by one")


def write_params(raw: dict[str, Any], path: str | Path) -> Path:
    from sim.traces.params import dump_yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Generator parameters for sim trace synth; see sim/traces/params.py for the fields.\n"
                    + dump_yaml(raw), encoding="utf-8")
    return path
