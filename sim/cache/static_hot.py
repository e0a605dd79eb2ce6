"""Static hot set (PowerInfer, Song et al. 2023): keep the neurons found most often
active on a profiling trace and never evict them; every other neuron is read on demand
and dropped (bypassed).

The hot set is the most frequently requested items of ``profile_counts`` (ties by
lower id) whose sizes fit the capacity, taken greedily in that order. By default a hot
item enters the cache on its first request (a cold start like every other policy, so
comparisons are fair); ``preload=True`` starts with the whole hot set resident, as a
runtime that loads it at model load time would.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, STEP, USED
from sim.cache.base import CachePolicy, check_counts, register
from sim.checks import check_bool


@njit(cache=True)
def static_hot_kernel(hot, res, size, pin, scal, items, sizes, offsets, hit):
    cap = scal[CAP]
    for s in range(offsets.shape[0] - 1):
        sid = scal[STEP]
        scal[STEP] = sid + 1
        for i in range(offsets[s], offsets[s + 1]):
            x = items[i]
            if res[x] != 0:
                hit[i] = True
                pin[x] = sid
            else:
                hit[i] = False
                if hot[x] and scal[USED] + sizes[i] <= cap:
                    res[x] = 1
                    size[x] = sizes[i]
                    pin[x] = sid
                    scal[USED] += sizes[i]
    return 0


def hot_set(counts: np.ndarray, item_bytes: np.ndarray, capacity_bytes: int) -> np.ndarray:
    """Bool mask of the most requested items (count > 0) that fit ``capacity_bytes``:
    greedy in decreasing count (ties: lower id), skipping items that no longer fit."""
    counts = np.asarray(counts)
    order = np.lexsort((np.arange(counts.shape[0]), -counts.astype(np.float64)))
    order = order[counts[order] > 0]
    return _greedy_fill(order.astype(np.int64), np.ascontiguousarray(item_bytes, dtype=np.int64),
                        int(capacity_bytes), counts.shape[0])


@njit(cache=True)
def _greedy_fill(order, sizes, capacity, n):
    mask = np.zeros(n, dtype=np.bool_)
    used = 0
    for x in order:
        if used + sizes[x] <= capacity:
            mask[x] = True
            used += sizes[x]
    return mask


@register("static-hot", "static hot set from a profile, never evicted (PowerInfer)")
class StaticHot(CachePolicy):
    """Static hot set chosen from profile counts; misses are bypassed."""

    needs_profile = True

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1, *,
                 profile_counts: np.ndarray | None = None, preload: bool = False):
        super().__init__(capacity_bytes, n_items, item_bytes)
        counts = check_counts(profile_counts, self.n_items, "static-hot")
        preload = check_bool(preload, "preload")
        self._hot = hot_set(counts, self.item_bytes, self.capacity_bytes).astype(np.uint8)
        if preload:
            self._res[:] = self._hot
            self._size[:] = np.where(self._hot != 0, self.item_bytes, 0)
            self._scal[USED] = int(self._size.sum())

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        return static_hot_kernel(self._hot, self._res, self._size, self._pin, self._scal, items, sizes, offsets,
                                 hit)
