"""LRU's misses at every cache size in one pass: stack distances (Mattson et al., 1970).

LRU is a *stack algorithm*: a cache of ``c`` items always holds the ``c`` most recently used
keys, so a request hits exactly when fewer than ``c`` other keys were used since its key's
last use. That count, the request's *stack distance*, does not depend on ``c``; one pass
gives every request's distance (a Fenwick tree over request positions marks each key's
latest use, O(log n) a request) and the misses at any size are a cumulative histogram.

Steps: a step's keys are looked up when it starts and then become the most recent keys in
request order. With one key per step this is the classic model, where the result equals
:class:`~sim.cache.lru.LRU`'s replay at every size (tests/cache/test_stack_distance.py). The
engine's batched steps (a layer's neurons at once, hits promoted before misses) are not a
stack algorithm: which of a step's keys are hits depends on the size, so their recency order
does, and a larger cache can miss where a smaller one hits. That is why the analytic
re-evaluation (:mod:`sim.engine.reevaluate`) replays the cache at a new budget instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.checks import int_array
from sim.errors import SimError

FIRST_USE = -1  # the distance of a key's first request: a miss at every size


@njit(cache=True)
def _distances(items, offsets, n_items):
    n = items.shape[0]
    tree = np.zeros(n + 1, np.int64)  # Fenwick tree: 1 at the latest position of each key
    last = np.full(n_items, -1, np.int64)
    out = np.empty(n, np.int64)
    for s in range(offsets.shape[0] - 1):
        lo, hi = offsets[s], offsets[s + 1]
        before = 0  # marks in [0, lo): every key used before the step, once
        i = lo
        while i > 0:
            before += tree[i]
            i -= i & -i
        for r in range(lo, hi):
            p = last[items[r]]
            if p < 0:
                out[r] = FIRST_USE
                continue
            upto = 0  # marks in [0, p]
            i = p + 1
            while i > 0:
                upto += tree[i]
                i -= i & -i
            out[r] = before - upto
        for r in range(lo, hi):
            x = items[r]
            p = last[x]
            if p >= 0:
                i = p + 1
                while i <= n:
                    tree[i] -= 1
                    i += i & -i
            i = r + 1
            while i <= n:
                tree[i] += 1
                i += i & -i
            last[x] = r
    return out


def stack_distances(items: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
    """Per request, how many other keys were used since its key's last use (before its step
    started), or :data:`FIRST_USE`. ``items[offsets[s]:offsets[s + 1]]`` is step ``s`` (unique
    keys); without ``offsets`` every request is a step of its own."""
    keys = np.ascontiguousarray(int_array(items, "items", "an array of integer keys >= 0"), dtype=np.int64)
    keys = keys.reshape(-1)
    if keys.size and keys.min() < 0:
        raise SimError("keys must be >= 0", field="items")
    bounds = np.arange(keys.size + 1, dtype=np.int64) if offsets is None else \
        np.ascontiguousarray(int_array(offsets, "offsets", "CSR step bounds"), dtype=np.int64).reshape(-1)
    if bounds.size < 1 or bounds[0] != 0 or bounds[-1] != keys.size or np.any(np.diff(bounds) < 0):
        raise SimError(f"must rise from 0 to len(items)={keys.size} (CSR step bounds)", field="offsets")
    n_items = int(keys.max()) + 1 if keys.size else 0
    return _distances(keys, bounds, n_items)


def lru_misses(distances: np.ndarray, sizes: np.ndarray | list[int]) -> np.ndarray:
    """Misses of an LRU cache of each of ``sizes`` items, from :func:`stack_distances`."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size and sizes.min() < 0:
        raise SimError("cache sizes must be >= 0 items", field="sizes")
    d = np.asarray(distances, dtype=np.int64)
    first = int(np.count_nonzero(d == FIRST_USE))
    reused = np.sort(d[d != FIRST_USE])
    # a reuse at distance d hits in a cache of more than d items
    return first + reused.size - np.searchsorted(reused, sizes, side="left")
