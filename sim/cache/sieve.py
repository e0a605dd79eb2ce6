"""SIEVE (Zhang et al., NSDI'24), as in libCacheSim's ``Sieve``.

One FIFO queue and a hand that moves from the tail towards the head. A hit sets the
item's visited bit; to evict, the hand clears visited bits until it finds an unvisited
item, evicts it and stays there. New items go to the head. Pinned items are passed over
without clearing their bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, FIRST_FREE, NONE, STEP, USED, new_list_state, push_head, unlink
from sim.cache.base import CachePolicy, register

HAND = FIRST_FREE


@njit(cache=True)
def sieve_kernel(prv, nxt, head, tail, vis, res, size, pin, scal, items, sizes, offsets, hit, evbuf, record):
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
                vis[x] = 1
            else:
                hit[i] = False
        for i in range(lo, hi):
            if hit[i]:
                continue
            x = items[i]
            sz = sizes[i]
            if sz > cap - pinned:
                continue
            while scal[USED] + sz > cap:
                o = scal[HAND]
                if o == NONE:
                    o = tail[0]
                while vis[o] > 0 or pin[o] == sid:
                    if pin[o] != sid:
                        vis[o] = 0
                    o = prv[o]
                    if o == NONE:
                        o = tail[0]
                scal[HAND] = prv[o]
                unlink(prv, nxt, head, tail, 0, o)
                res[o] = 0
                scal[USED] -= size[o]
                if record:
                    evbuf[n_ev] = o
                n_ev += 1
            push_head(prv, nxt, head, tail, 0, x)
            res[x] = 1
            vis[x] = 0
            size[x] = sz
            pin[x] = sid
            pinned += sz
            scal[USED] += sz
    return n_ev


@register("sieve", "SIEVE (NSDI'24)")
class Sieve(CachePolicy):
    """SIEVE: FIFO with a lazily moving eviction hand."""

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1):
        super().__init__(capacity_bytes, n_items, item_bytes)
        self._scal[HAND] = NONE
        self._prv, self._nxt, self._head, self._tail = new_list_state(self.n_items, 1)
        self._vis = np.zeros(self.n_items, dtype=np.uint8)

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        return sieve_kernel(self._prv, self._nxt, self._head, self._tail, self._vis, self._res, self._size,
                            self._pin, self._scal, items, sizes, offsets, hit, evbuf, record)
