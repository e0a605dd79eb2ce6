"""LRU: evict the least recently used item.

Hits move to the head of one recency list and misses are inserted there, so within a
step all pinned items form a contiguous block at the head and the tail is always an
evictable item (when one exists): a step is O(keys) with no scanning and no pin marks.
The list nodes are rows of one array (:mod:`sim.cache._aos`) for memory locality.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._aos import HEAD, SIZE, new_nodes, node_pop_tail, node_push_head, node_unlink
from sim.cache._lists import CAP, NONE, STEP, USED
from sim.cache.base import CachePolicy, register


@njit(cache=True)
def lru_kernel(node, scal, items, sizes, offsets, hit, evbuf, record):
    n_ev = 0
    cap = scal[CAP]
    for s in range(offsets.shape[0] - 1):
        scal[STEP] += 1
        lo = offsets[s]
        hi = offsets[s + 1]
        pinned = 0
        for i in range(lo, hi):
            x = items[i]
            if node[x, SIZE] != 0:
                hit[i] = True
                pinned += node[x, SIZE]
                if scal[HEAD] != x:
                    node_unlink(node, scal, x)
                    node_push_head(node, scal, x)
            else:
                hit[i] = False
        for i in range(lo, hi):
            if hit[i]:
                continue
            x = items[i]
            sz = sizes[i]
            if sz > cap - pinned:
                continue  # bypass: cannot fit next to this step's pinned items
            while scal[USED] + sz > cap:
                v = node_pop_tail(node, scal)  # never pinned: pinned items sit in a block at the head
                scal[USED] -= node[v, SIZE]
                node[v, SIZE] = 0
                if record:
                    evbuf[n_ev] = v
                n_ev += 1
            node_push_head(node, scal, x)
            node[x, SIZE] = sz
            pinned += sz
            scal[USED] += sz
    return n_ev


@register("lru", "least recently used")
class LRU(CachePolicy):
    """Least recently used."""

    item_arrays = False

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1):
        super().__init__(capacity_bytes, n_items, item_bytes)
        self._node = new_nodes(self.n_items)
        self._scal[HEAD] = NONE
        self._scal[HEAD + 1] = NONE

    def resident_mask(self) -> np.ndarray:
        return self._node[:, SIZE] != 0  # a resident item has a size, an absent one 0

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        return lru_kernel(self._node, self._scal, items, sizes, offsets, hit, evbuf, record)
