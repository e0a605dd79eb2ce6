"""sim/traces/stats.py against a brute-force reference written with Python sets."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_helpers import random_trace

from sim.traces.stats import K_MAX, POPULARITY_PERCENTS, trace_stats


def _reference(trace):
    m = trace.meta
    n_keys = m.n_experts * m.n_neurons
    sets = [[set() for _ in range(m.n_layers)] for _ in range(m.n_tokens)]
    counts = np.zeros((m.n_layers, n_keys))
    n_active = np.zeros(m.n_layers)
    for ch in trace.chunks():
        for i in range(ch.n_tokens):
            t = ch.start + i
            for layer in range(m.n_layers):
                for slot in range(m.top_k):
                    e = int(ch.experts[i, layer, slot])
                    for nid in ch.active(t, layer, slot):
                        sets[t][layer].add(e * m.n_neurons + int(nid))
                        counts[layer, e * m.n_neurons + int(nid)] += 1
                        n_active[layer] += 1
    t0 = min(K_MAX, m.n_tokens // 4)
    span = range(t0, m.n_tokens)
    new, union = {}, {}
    for k in range(K_MAX + 1):
        per_layer = []
        for layer in range(m.n_layers):
            tot = 0
            for t in span:
                window = set().union(*[sets[s][layer] for s in range(max(0, t - k), t)])
                tot += len(sets[t][layer] - window)
            per_layer.append(tot / (len(span) * n_keys))
        new[k] = float(np.mean(per_layer))
        if k:
            union[k] = float(np.mean([
                sum(len(set().union(*[sets[s][layer] for s in range(max(0, t - k + 1), t + 1)])) for t in span)
                / (len(span) * n_keys) for layer in range(m.n_layers)]))
    hits = sum(len(sets[t][layer] & sets[t - 1][layer]) for t in range(1, m.n_tokens) for layer in range(m.n_layers))
    alls = sum(len(sets[t][layer]) for t in range(1, m.n_tokens) for layer in range(m.n_layers))
    density = n_active / (m.n_tokens * m.top_k * m.n_neurons)
    return {"new": new, "union": union, "overlap": hits / max(alls, 1), "density": density, "counts": counts}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_layers=st.integers(1, 3), n_neurons=st.integers(1, 30),
       n_experts=st.integers(1, 4), top_k=st.integers(1, 2), n_tokens=st.integers(1, 30),
       density=st.floats(0.0, 0.9))
def test_stats_match_brute_force(seed, n_layers, n_neurons, n_experts, top_k, n_tokens, density):
    top_k = min(top_k, n_experts)
    trace = random_trace(np.random.default_rng(seed), n_layers=n_layers, n_neurons=n_neurons,
                         n_experts=n_experts, top_k=top_k, n_tokens=n_tokens, chunk_tokens=7, density=density)
    got, ref = trace_stats(trace), _reference(trace)
    np.testing.assert_allclose(got["density"], ref["density"], atol=1e-12)
    for k in range(K_MAX + 1):
        assert abs(got["window_new_share"][k] - ref["new"][k]) < 1e-12, k
    for k in range(1, K_MAX + 1):
        assert abs(got["window_union_share"][k] - ref["union"][k]) < 1e-12, k
    assert abs(got["overlap"] - ref["overlap"]) < 1e-12
    counts = ref["counts"]
    for x in POPULARITY_PERCENTS:
        top = max(1, int(np.ceil(x / 100 * counts.shape[1])))
        srt = -np.sort(-counts, axis=1)
        per_layer = srt[:, :top].sum(1) / np.maximum(srt.sum(1), 1)
        weights = counts.sum(1) / max(counts.sum(), 1)
        assert abs(got["popularity"][x] - float((weights * per_layer).sum())) < 1e-12
    assert abs(sum(got["reuse_distance"]["share"]) - (1.0 if counts.sum() else 0.0)) < 1e-9


def test_predictor_quality_and_expert_stats():
    rng = np.random.default_rng(5)
    trace = random_trace(rng, n_layers=2, n_neurons=20, n_experts=4, top_k=2, n_tokens=40, predictions=True)
    s = trace_stats(trace)
    tp = n_act = n_pred = 0
    prev = None
    overlap = any_rep = 0
    for ch in trace.chunks():
        for i in range(ch.n_tokens):
            t = ch.start + i
            for layer in range(2):
                for slot in range(2):
                    a, p = set(ch.active(t, layer, slot).tolist()), set(ch.predicted(t, layer, slot).tolist())
                    tp, n_act, n_pred = tp + len(a & p), n_act + len(a), n_pred + len(p)
            if prev is not None:
                for layer in range(2):
                    shared = len(set(prev[layer].tolist()) & set(ch.experts[i, layer].tolist()))
                    overlap += shared
                    any_rep += shared > 0
            prev = ch.experts[i].copy()
    assert abs(s["predicted"]["recall_mean"] - tp / n_act) < 1e-12
    assert abs(s["predicted"]["precision_mean"] - tp / n_pred) < 1e-12
    assert abs(s["experts"]["persistence_mean"] - overlap / (39 * 2 * 2)) < 1e-12
    assert abs(s["experts"]["repeat_any_mean"] - any_rep / (39 * 2)) < 1e-12
    assert np.allclose(np.sum(s["experts"]["popularity"], axis=1), 1.0)


def test_per_layer_frame_is_tidy():
    from sim.traces.stats import per_layer_frame

    trace = random_trace(np.random.default_rng(2), n_layers=3, n_experts=2, top_k=1, n_tokens=12, predictions=True)
    stats = trace_stats(trace)
    frame = per_layer_frame(stats)
    assert list(frame["layer"]) == [0, 1, 2]
    assert np.allclose(frame["density"], stats["density"])
    assert {"window_new_share_k10", "popularity_top1pct", "recall", "expert_persistence"} <= set(frame.columns)
