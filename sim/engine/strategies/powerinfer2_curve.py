"""PowerInfer-2's analytic plans at any budget from one pass over the trace.

A budget moves two things in PowerInfer-2's plans: how many of the most popular neurons the
hot region pins (and with it which of them the NPU computes), and how large the LRU of the
rest is. :class:`~sim.cache.pinned_lru_curve.PinnedLRUCurve` answers the misses at any such
pair, so the warm-up and decode tokens are read once per trace and every budget after that
costs array lookups, where the replay (:meth:`PowerInfer2.analytic_plan`) serves every token
through the cache again. The plans hold one cluster per layer: the analytic costs add a
layer's clusters up (work, reads, whether it reads at all), so the split into clusters does
not enter them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from sim.cache.pinned_lru_curve import PinnedLRUCurve
from sim.engine.neuron_cache import pinned_split, popularity_ranks
from sim.engine.scheduler import top_share
from sim.engine.workload import TokenWork

FIRED = 1  # the neuron is in the token's active set (not only predicted)
NPU = 2  # the neuron is among those the NPU computes, if pinned


@dataclass(frozen=True)
class BudgetCurve:
    """A trace's requests as the curve holds them, with what the NPU's share needs."""

    curve: PinnedLRUCurve
    experts: np.ndarray  # (tokens, layers, top_k) chosen experts
    npu_ranks: list[np.ndarray]  # per (layer, expert): sorted ranks of the neurons the NPU would compute
    warmup_tokens: int
    n_layers: int


@njit(cache=True)
def _fired(predicted, active, marks):
    """Per predicted key whether it is active (``marks`` all zero, left so)."""
    for k in active:
        marks[k] = 1
    out = np.empty(predicted.shape[0], np.uint8)
    for i in range(predicted.shape[0]):
        out[i] = marks[predicted[i]]
    for k in active:
        marks[k] = 0
    return out


def build(strategy: Any, tokens: Iterable[tuple[int, TokenWork]], warmup_tokens: int) -> BudgetCurve:
    """Read the warm-up and decode tokens once (``tokens``, in order) into a :class:`BudgetCurve`."""
    ctx = strategy.ctx
    meta, pop = ctx.meta, ctx.popularity
    n_layers, n_experts, n_neurons = meta.n_layers, meta.n_experts, meta.n_neurons
    share = top_share(pop.reshape(n_layers * n_experts, n_neurons), strategy.k.npu_activation_share).reshape(-1) \
        if strategy.use_npu else np.zeros(pop.size, dtype=bool)
    npu_flag = share.astype(np.uint8) * np.uint8(NPU)
    marks = np.zeros(pop.size, dtype=np.uint8)
    keys, flags, sizes, experts = [], [], [], []
    small = pop.size < 2**31  # keys as int32 where they fit: the requests are the build's bulk
    for _t, work in tokens:
        predicted = work.predicted
        keys.append(predicted.astype(np.int32) if small else predicted)
        flags.append(_fired(predicted, work.active, marks) | npu_flag[predicted])
        sizes.append(np.diff(work.p_bounds))
        experts.append(work.experts)
    n_tokens = len(keys)
    seg_sizes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
    seg_bounds = np.concatenate([[0], np.cumsum(seg_sizes)]).astype(np.int64)
    ranks = popularity_ranks(pop)
    by_rank = np.sort(pop)[::-1]
    ties = np.concatenate([[0], np.flatnonzero(np.diff(by_rank)) + 1])  # where each profile count starts
    all_keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    all_flags = np.concatenate(flags) if flags else np.zeros(0, np.uint8)
    del keys, flags
    curve = PinnedLRUCurve.build(all_keys, seg_bounds, np.repeat(np.arange(n_tokens), n_layers), n_tokens, ranks,
                                 all_flags, classes=(0, FIRED), counted=(NPU, NPU | FIRED), tie_starts=ties)
    npu_ranks = [np.sort(ranks[g * n_neurons:(g + 1) * n_neurons][share[g * n_neurons:(g + 1) * n_neurons]])
                 for g in range(n_layers * n_experts)]
    return BudgetCurve(curve, np.array(experts, dtype=np.int64).reshape(n_tokens, n_layers, -1), npu_ranks,
                       warmup_tokens, n_layers)


def plan_columns(strategy: Any, bc: BudgetCurve) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """At ``strategy``'s budget (its neuron cache's bytes and hot share), per decode token and
    layer: the NPU's neurons, and the CPU's (one cluster a layer) neurons, fired neurons, Gate
    misses and Up/Down misses."""
    ctx, k = strategy.ctx, strategy.k
    n_hot, cold_bytes = pinned_split(ctx.n_keys, ctx.plan.neuron_dram_bytes, ctx.plan.neuron_cache_bytes,
                                     ctx.popularity, k.hot_share)
    curve = bc.curve
    miss = curve.misses(n_hot, cold_bytes // ctx.plan.neuron_dram_bytes)
    predicted, fired = curve.totals[0].astype(float), curve.totals[FIRED].astype(float)
    if strategy.use_npu:
        predicted = predicted - curve.below(n_hot, NPU)
        fired = fired - curve.below(n_hot, NPU | FIRED)
        per_group = np.array([np.searchsorted(r, n_hot) for r in bc.npu_ranks], dtype=float)
        layer_group = np.arange(bc.n_layers)[None, :, None] * ctx.meta.n_experts + bc.experts
        n_npu = per_group[layer_group].sum(axis=2)
    else:
        n_npu = np.zeros(bc.experts.shape[:2])
    decode = slice(bc.warmup_tokens * bc.n_layers, None)
    cols = tuple(np.rint(x[decode]).astype(np.int64).reshape(-1, bc.n_layers)
                 for x in (predicted, fired, miss[0], miss[FIRED]))
    return n_npu[bc.warmup_tokens:], cols
