"""FIFO: evict the item inserted longest ago; hits change nothing.

Pinned hits stay where they are in the queue, so eviction walks from the tail past them.
The walk position is kept for the rest of the step: in phase 2 only pinned items are
inserted and only unpinned ones leave, so nothing behind the cursor can become evictable.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, NONE, STEP, USED, new_list_state, push_head, unlink
from sim.cache.base import CachePolicy, register


@njit(cache=True)
def fifo_kernel(prv, nxt, head, tail, res, size, pin, scal, items, sizes, offsets, hit, evbuf, record):
    n_ev = 0
    cap = scal[CAP]
    for s in range(offsets.shape[0] - 1):
        sid = scal[STEP]
        scal[STEP] = sid + 1
        lo = offsets[s]
        hi = offsets[s + 1]
        pinned = 0
        for i in range(lo, hi):
            x = items[i]
            if res[x] != 0:
                hit[i] = True
                pin[x] = sid
                pinned += size[x]
            else:
                hit[i] = False
        cursor = NONE
        started = False
        for i in range(lo, hi):
            if hit[i]:
                continue
            x = items[i]
            sz = sizes[i]
            if sz > cap - pinned:
                continue
            while scal[USED] + sz > cap:
                if not started:
                    cursor = tail[0]
                    started = True
                while pin[cursor] == sid:
                    cursor = prv[cursor]
                v = cursor
                cursor = prv[v]
                unlink(prv, nxt, head, tail, 0, v)
                res[v] = 0
                scal[USED] -= size[v]
                if record:
                    evbuf[n_ev] = v
                n_ev += 1
            push_head(prv, nxt, head, tail, 0, x)
            res[x] = 1
            size[x] = sz
            pin[x] = sid
            pinned += sz
            scal[USED] += sz
    return n_ev


@register("fifo", "first in, first out")
class FIFO(CachePolicy):
    """First in, first out."""

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1):
        super().__init__(capacity_bytes, n_items, item_bytes)
        self._prv, self._nxt, self._head, self._tail = new_list_state(self.n_items, 1)

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        return fifo_kernel(self._prv, self._nxt, self._head, self._tail, self._res, self._size, self._pin,
                           self._scal, items, sizes, offsets, hit, evbuf, record)
