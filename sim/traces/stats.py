"""Statistics of an activation trace: what a neuron cache and a flash loader will see.

One streaming pass over the chunks (numba) computes, per layer:

- ``density``: mean fraction of an expert's FFN neurons active per token (dense: of the
  layer's FFN). For MoE this is per *routed* expert, the figure papers quote ("85%
  inactive per expert").
- ``window_new_share[k]`` (k = 0..10): the fraction of the layer's FFN neurons that are
  needed at token t but were not needed by any of the previous k tokens (LLM in a Flash's
  sliding window: these are what must be loaded per token). k = 0 loads everything
  needed, so it equals the share of the layer's neurons needed per token.
- ``window_union_share[k]`` (k = 1..10): the fraction of FFN neurons needed by at least
  one of the last k tokens (what the window keeps resident).
- ``popularity[x]``: share of all activations covered by the top x% of neurons.
- ``overlap``: fraction of the neurons needed at t that were also needed at t - 1.
- ``reuse_distance``: histogram of the distance, in tokens, from a neuron's activation to
  its previous activation (``first`` for neurons never seen before).
- MoE: ``experts.popularity`` (each expert's share of selections per layer),
  ``experts.persistence`` (mean fraction of a token's experts also chosen by the previous
  token) and ``experts.repeat_any`` (probability that consecutive tokens share at least
  one expert, Mixtral paper Table 5's "first or second choice").

For MoE models the unit of all neuron statistics is an (expert, neuron) pair and the
denominators are all experts' neurons of the layer (``n_experts * n_neurons``): the FFN
neurons of a layer are every expert's neurons, and a window or cache holds neurons of any
expert. So ``window_new_share[0] = density * top_k / n_experts`` there.

Window and union figures average over tokens ``t >= t0`` (``t0 = min(10, n_tokens // 4)``)
so the empty window at the start of a trace does not bias them. When the trace holds
predicted sets, the same statistics are computed for them under ``predicted`` (the sets a
loader actually fetches), together with the predictor's recall and precision per layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numba as nb
import numpy as np

from sim.traces.format import Trace, require_tokens

K_MAX = 10
POPULARITY_PERCENTS = (1, 5, 10, 20, 50)
REUSE_BINS = ("1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65-128", "129-256", ">256", "first")
_CURVE_POINTS = np.unique(np.concatenate([np.geomspace(0.001, 1.0, 40), np.linspace(0.05, 1.0, 20)]))


@nb.njit(cache=True)
def _bitlen(x: int) -> int:
    b = 0
    while x > 0:
        x >>= 1
        b += 1
    return b


@nb.njit(cache=True)
def _accumulate(offsets, ids, experts, t_start, n_neurons, n_tokens, t0, kmax,
                last_seen, counts, win_hist, reuse_hist, union_acc, overlap, pool_last):
    """Add one chunk's rows to the accumulators (see module docstring for meanings)."""
    n_tok, n_layers, top_k = experts.shape
    nb_reuse = reuse_hist.shape[1]
    row = 0
    for i in range(n_tok):
        t = t_start + i
        for layer in range(n_layers):
            for slot in range(top_k):
                e = np.int64(experts[i, layer, slot])
                base = e * n_neurons
                prev_used = pool_last[layer, e] == t - 1
                for j in range(offsets[row], offsets[row + 1]):
                    key = base + ids[j]
                    counts[layer, key] += 1
                    s = last_seen[layer, key]
                    if s < 0:
                        gap = -1
                        reuse_hist[layer, nb_reuse - 1] += 1
                    else:
                        gap = t - s
                        reuse_hist[layer, min(_bitlen(gap - 1), nb_reuse - 2)] += 1
                        # the previous activation at s stayed the most recent until t
                        lo = max(s, t0)
                        for k in range(1, kmax + 1):
                            hi = s + min(gap, k) - 1
                            if hi >= lo:
                                union_acc[layer, k] += hi - lo + 1
                    if t >= t0:
                        win_hist[layer, kmax + 1 if gap < 0 else min(gap, kmax + 1)] += 1
                    if t >= 1:
                        overlap[layer, 1] += 1
                        if gap == 1:
                            overlap[layer, 0] += 1
                        if prev_used:
                            overlap[layer, 2] += 1
                    last_seen[layer, key] = t
                pool_last[layer, e] = t
                row += 1


@nb.njit(cache=True)
def _finish_union(last_seen, n_tokens, t0, kmax, union_acc):
    """Count the windows covered by each neuron's last activation (no later one exists)."""
    n_layers, n_keys = last_seen.shape
    for layer in range(n_layers):
        for key in range(n_keys):
            s = last_seen[layer, key]
            if s < 0:
                continue
            lo = max(s, t0)
            for k in range(1, kmax + 1):
                hi = min(s + k - 1, n_tokens - 1)
                if hi >= lo:
                    union_acc[layer, k] += hi - lo + 1


@nb.njit(cache=True)
def _predictor_quality(offsets, ids, pred_offsets, pred_ids, n_layers, top_k, acc):
    """Per layer: acc[l] += (true positives, |active|, |predicted|), by sorted-merge per row."""
    n_rows = offsets.shape[0] - 1
    for r in range(n_rows):
        layer = (r // top_k) % n_layers
        a, a_end = offsets[r], offsets[r + 1]
        p, p_end = pred_offsets[r], pred_offsets[r + 1]
        acc[layer, 1] += a_end - a
        acc[layer, 2] += p_end - p
        tp = 0
        while a < a_end and p < p_end:
            if ids[a] == pred_ids[p]:
                tp += 1
                a += 1
                p += 1
            elif ids[a] < pred_ids[p]:
                a += 1
            else:
                p += 1
        acc[layer, 0] += tp


@dataclass
class _SetAccumulator:
    """Running sums for one family of sets (active or predicted)."""

    n_layers: int
    n_keys: int
    last_seen: np.ndarray = field(init=False)
    counts: np.ndarray = field(init=False)
    win_hist: np.ndarray = field(init=False)
    reuse_hist: np.ndarray = field(init=False)
    union_acc: np.ndarray = field(init=False)
    overlap: np.ndarray = field(init=False)
    pool_last: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.last_seen = np.full((self.n_layers, self.n_keys), -1, np.int64)
        self.counts = np.zeros((self.n_layers, self.n_keys), np.int64)
        self.win_hist = np.zeros((self.n_layers, K_MAX + 2), np.int64)
        self.reuse_hist = np.zeros((self.n_layers, len(REUSE_BINS)), np.int64)
        self.union_acc = np.zeros((self.n_layers, K_MAX + 1), np.int64)
        self.overlap = np.zeros((self.n_layers, 3), np.int64)
        self.pool_last = None  # type: ignore[assignment]

    def add(self, offsets: np.ndarray, ids: np.ndarray, experts: np.ndarray, t_start: int, n_neurons: int,
            n_tokens: int, t0: int, n_experts: int) -> None:
        if self.pool_last is None:
            self.pool_last = np.full((self.n_layers, n_experts), -2, np.int64)
        _accumulate(offsets, ids, experts, t_start, n_neurons, n_tokens, t0, K_MAX, self.last_seen, self.counts,
                    self.win_hist, self.reuse_hist, self.union_acc, self.overlap, self.pool_last)

    def result(self, n_tokens: int, t0: int, rows_per_layer: int, n_neurons: int) -> dict[str, Any]:
        _finish_union(self.last_seen, n_tokens, t0, K_MAX, self.union_acc)
        measured = max(n_tokens - t0, 1)
        denom = measured * self.n_keys
        # window_new_share[k] = activations at t >= t0 whose gap exceeds k (or first ever)
        tail = np.cumsum(self.win_hist[:, ::-1], axis=1)[:, ::-1]  # tail[:, b] = sum_{b' >= b}
        new_share = np.stack([tail[:, k + 1] for k in range(K_MAX + 1)], axis=1) / denom
        union_share = self.union_acc[:, 1:] / denom
        total = self.counts.sum(axis=1)
        density = total / max(rows_per_layer * n_neurons, 1)
        pop_layers = _popularity(self.counts)
        overlap_layer = np.where(self.overlap[:, 1] > 0, self.overlap[:, 0] / np.maximum(self.overlap[:, 1], 1), 0.0)
        reuse = self.reuse_hist.sum(axis=0)
        weights = total / max(total.sum(), 1)
        return {
            "density": density.tolist(),
            "density_mean": float(density.mean()),
            "window_new_share": {k: float(new_share[:, k].mean()) for k in range(K_MAX + 1)},
            "window_new_share_per_layer": new_share.tolist(),
            "window_union_share": {k: float(union_share[:, k - 1].mean()) for k in range(1, K_MAX + 1)},
            "popularity": {x: float(np.sum(weights * pop_layers[x])) for x in POPULARITY_PERCENTS},
            "popularity_per_layer": {x: pop_layers[x].tolist() for x in POPULARITY_PERCENTS},
            "popularity_curve": {"top_fraction": _CURVE_POINTS.tolist(),
                                 "share": _curve(self.counts, weights).tolist()},
            "overlap": float(self.overlap[:, 0].sum() / max(self.overlap[:, 1].sum(), 1)),
            "overlap_per_layer": overlap_layer.tolist(),
            "overlap_same_expert": float(self.overlap[:, 0].sum() / max(self.overlap[:, 2].sum(), 1)),
            "overlap_same_expert_per_layer": (self.overlap[:, 0] / np.maximum(self.overlap[:, 2], 1)).tolist(),
            "reuse_distance": {"bins": list(REUSE_BINS), "share": (reuse / max(reuse.sum(), 1)).tolist()},
        }


def _popularity(counts: np.ndarray) -> dict[int, np.ndarray]:
    srt = -np.sort(-counts, axis=1)
    cum = np.cumsum(srt, axis=1)
    total = np.maximum(cum[:, -1], 1)
    n_keys = counts.shape[1]
    return {x: cum[:, max(1, int(np.ceil(x / 100 * n_keys))) - 1] / total for x in POPULARITY_PERCENTS}


def _curve(counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    srt = -np.sort(-counts, axis=1)
    cum = np.cumsum(srt, axis=1) / np.maximum(srt.sum(axis=1, keepdims=True), 1)
    idx = np.maximum(1, np.ceil(_CURVE_POINTS * counts.shape[1]).astype(np.int64)) - 1
    return (weights[:, None] * cum[:, idx]).sum(axis=0)


def trace_stats(trace: Trace) -> dict[str, Any]:
    """All statistics of ``trace`` (one pass over its chunks), as a JSON-ready dict."""
    require_tokens(trace, "statistics")  # else every figure is a zero, not an answer
    meta = trace.meta
    n_l, n_e, k, n = meta.n_layers, meta.n_experts, meta.top_k, meta.n_neurons
    n_keys = n_e * n
    t0 = min(K_MAX, meta.n_tokens // 4)
    active = _SetAccumulator(n_l, n_keys)
    pred = _SetAccumulator(n_l, n_keys) if meta.has_predictions else None
    quality = np.zeros((n_l, 3), np.int64)
    exp_counts = np.zeros((n_l, n_e), np.int64)
    exp_overlap = np.zeros(n_l, np.int64)
    exp_any = np.zeros(n_l, np.int64)
    prev_exp: np.ndarray | None = None
    n_pairs = 0
    n_tokens = 0
    for chunk in trace.chunks():
        active.add(chunk.offsets, chunk.ids, chunk.experts, chunk.start, n, meta.n_tokens, t0, n_e)
        if pred is not None and chunk.pred_offsets is not None and chunk.pred_ids is not None:
            pred.add(chunk.pred_offsets, chunk.pred_ids, chunk.experts, chunk.start, n, meta.n_tokens, t0, n_e)
            _predictor_quality(chunk.offsets, chunk.ids, chunk.pred_offsets, chunk.pred_ids, n_l, k, quality)
        if n_e > 1:
            exp = chunk.experts.astype(np.int64)
            np.add.at(exp_counts, (np.broadcast_to(np.arange(n_l)[None, :, None], exp.shape), exp), 1)
            seq = exp if prev_exp is None else np.concatenate([prev_exp[None], exp])
            if seq.shape[0] > 1:
                same = (seq[1:, :, :, None] == seq[:-1, :, None, :]).any(axis=3)  # (t, layer, slot)
                hits = same.sum(axis=2)
                exp_overlap += hits.sum(axis=0)
                exp_any += (hits > 0).sum(axis=0)
                n_pairs += seq.shape[0] - 1
            prev_exp = exp[-1]
        n_tokens += chunk.n_tokens
    out: dict[str, Any] = {
        "model": meta.model, "source": meta.source, "n_tokens": n_tokens, "n_layers": n_l,
        "n_neurons": n, "n_experts": n_e, "top_k": k, "window_t0": t0,
    }
    out.update(active.result(n_tokens, t0, n_tokens * k, n))
    if n_e > 1:
        shares = exp_counts / np.maximum(exp_counts.sum(axis=1, keepdims=True), 1)
        pers = exp_overlap / max(n_pairs * k, 1)
        rep = exp_any / max(n_pairs, 1)
        uniform_any = 1.0 - _comb(n_e - k, k) / _comb(n_e, k)
        out["experts"] = {
            "popularity": shares.tolist(),
            "persistence": pers.tolist(), "persistence_mean": float(pers.mean()),
            "repeat_any": rep.tolist(), "repeat_any_mean": float(rep.mean()),
            "repeat_any_uniform_random": uniform_any,
        }
    if pred is not None:
        p_out = pred.result(n_tokens, t0, n_tokens * k, n)
        tp, n_act, n_pred = quality[:, 0], quality[:, 1], quality[:, 2]
        p_out["recall"] = (tp / np.maximum(n_act, 1)).tolist()
        p_out["precision"] = (tp / np.maximum(n_pred, 1)).tolist()
        p_out["recall_mean"] = float(tp.sum() / max(n_act.sum(), 1))
        p_out["precision_mean"] = float(tp.sum() / max(n_pred.sum(), 1))
        out["predicted"] = p_out
    return out


def _comb(n: int, k: int) -> float:
    from math import comb

    return float(comb(n, k)) if 0 <= k <= n else 0.0


def to_json(stats: dict[str, Any]) -> str:
    return json.dumps(stats, indent=2, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def summary_rows(stats: dict[str, Any]) -> list[tuple[str, float | None]]:
    """Scalar figures in display order (for ``sim trace stats`` and ``compare``)."""
    rows: list[tuple[str, float | None]] = [
        ("tokens", stats["n_tokens"]), ("density (mean over layers)", stats["density_mean"]),
        ("density min layer", min(stats["density"])), ("density max layer", max(stats["density"])),
    ]
    rows += [(f"popularity top {x}%", stats["popularity"][x]) for x in POPULARITY_PERCENTS]
    rows += [(f"window_new_share k={k}", stats["window_new_share"][k]) for k in range(K_MAX + 1)]
    rows += [(f"window_union_share k={k}", stats["window_union_share"][k]) for k in (1, 2, 5, 10)]
    rows.append(("overlap (t vs t-1)", stats["overlap"]))
    rows += [(f"reuse distance {b}", s) for b, s in zip(stats["reuse_distance"]["bins"],
                                                        stats["reuse_distance"]["share"], strict=True)]
    if "experts" in stats:
        rows.append(("expert persistence", stats["experts"]["persistence_mean"]))
        rows.append(("expert repeat (any)", stats["experts"]["repeat_any_mean"]))
        pop = np.asarray(stats["experts"]["popularity"])
        rows.append(("expert share max/min", float(pop.max() / max(pop.min(), 1e-12))))
    if "predicted" in stats:
        p = stats["predicted"]
        rows += [("predictor recall", p["recall_mean"]), ("predictor precision", p["precision_mean"]),
                 ("predicted density", p["density_mean"])]
        rows += [(f"predicted window_new_share k={k}", p["window_new_share"][k]) for k in (0, 1, 2, 5, 10)]
        rows += [(f"predicted window_union_share k={k}", p["window_union_share"][k]) for k in (1, 5, 10)]
    return rows


def per_layer_frame(stats: dict[str, Any]) -> Any:
    """Per-layer statistics as a tidy pandas DataFrame (one row per layer)."""
    import pandas as pd

    n_layers = len(stats["density"])
    cols: dict[str, Any] = {"layer": list(range(n_layers)), "density": stats["density"],
                            "overlap": stats["overlap_per_layer"]}
    new = np.asarray(stats["window_new_share_per_layer"])
    for k in range(new.shape[1]):
        cols[f"window_new_share_k{k}"] = new[:, k]
    for x in POPULARITY_PERCENTS:
        cols[f"popularity_top{x}pct"] = stats["popularity_per_layer"][x]
    if "predicted" in stats:
        cols["predicted_density"] = stats["predicted"]["density"]
        cols["recall"] = stats["predicted"]["recall"]
        cols["precision"] = stats["predicted"]["precision"]
    if "experts" in stats:
        cols["expert_persistence"] = stats["experts"]["persistence"]
        cols["expert_repeat_any"] = stats["experts"]["repeat_any"]
    return pd.DataFrame(cols)


def normalise_json_keys(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats read back from JSON have string keys ("5"); turn k / percent keys into ints."""

    def fix(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {(int(k) if isinstance(k, str) and k.isdigit() else k): fix(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [fix(v) for v in obj]
        return obj

    return fix(stats)
