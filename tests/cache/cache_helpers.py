"""Shared helpers for the cache tests: request streams and small traces built with numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from sim.traces.format import Trace, TraceMeta


def csr(steps: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Steps (lists of keys) -> (items, offsets)."""
    items = np.array([k for s in steps for k in s], dtype=np.int64)
    offsets = np.zeros(len(steps) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in steps], out=offsets[1:])
    return items, offsets


def random_steps(rng: np.random.Generator, n_items: int, n_steps: int, max_step: int,
                 skew: float = 1.3) -> list[list[int]]:
    """Batches of unique keys with Zipf-like popularity (a few keys are hot)."""
    out = []
    for _ in range(n_steps):
        k = int(rng.integers(1, max_step + 1))
        keys = np.unique((rng.zipf(skew, k) - 1) % n_items)
        out.append(sorted(int(x) for x in keys))
    return out


def steps_strategy(max_items: int = 8, max_steps: int = 25, max_step: int = 4):
    """Hypothesis: (n_items, steps) with unique keys per step."""
    return st.integers(2, max_items).flatmap(
        lambda n: st.tuples(st.just(n), st.lists(
            st.lists(st.integers(0, n - 1), min_size=1, max_size=min(max_step, n), unique=True).map(sorted),
            min_size=1, max_size=max_steps)))


def toy_trace(n_tokens: int = 24, n_layers: int = 3, n_experts: int = 4, top_k: int = 2, n_neurons: int = 64,
              density: float = 0.15, persistence: float = 0.7, seed: int = 0, chunk_tokens: int = 8) -> Trace:
    """A small MoE trace with skewed per-neuron popularity and temporal reuse."""
    rng = np.random.default_rng(seed)
    meta = TraceMeta(model="toy-moe", n_layers=n_layers, n_neurons=n_neurons, hidden=32, n_experts=n_experts,
                     top_k=top_k, chunk_tokens=chunk_tokens)
    p = rng.pareto(1.5, (n_layers, n_experts, n_neurons)) + 0.05
    p = np.minimum(p / p.mean(axis=2, keepdims=True) * density, 0.95)
    state = rng.random(p.shape) < p
    rows = []
    experts = np.zeros((n_tokens, n_layers, top_k), dtype=np.int16)
    for t in range(n_tokens):
        for layer in range(n_layers):
            chosen = rng.choice(n_experts, top_k, replace=False)
            experts[t, layer] = chosen
            for e in chosen:
                keep = rng.random(n_neurons) < persistence
                state[layer, e] = np.where(keep, state[layer, e], rng.random(n_neurons) < p[layer, e])
                rows.append(np.flatnonzero(state[layer, e]))
    return Trace.from_rows(meta, rows, experts)
