"""CLOCK (FIFO with reinsertion, second chance), as in libCacheSim's ``Clock``.

A hit raises the item's counter (saturating at ``2**bits - 1``); an item reaching the
tail with a non-zero counter is moved to the head with the counter decremented, an item
with a zero counter is evicted. A pinned item reaching the tail is moved to the head with
its counter untouched (it was just referenced, so a second chance is what CLOCK would
give it anyway).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, FIRST_FREE, STEP, USED, new_list_state, push_head, unlink
from sim.cache.base import CachePolicy, register
from sim.checks import check_int

MAXF = FIRST_FREE


@njit(cache=True)
def clock_kernel(prv, nxt, head, tail, freq, res, size, pin, scal, items, sizes, offsets, hit, evbuf, record):
    n_ev = 0
    cap = scal[CAP]
    maxf = scal[MAXF]
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
                if freq[x] < maxf:
                    freq[x] += 1
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
                v = tail[0]
                while pin[v] == sid or freq[v] >= 1:
                    if pin[v] != sid:
                        freq[v] -= 1
                    unlink(prv, nxt, head, tail, 0, v)
                    push_head(prv, nxt, head, tail, 0, v)
                    v = tail[0]
                unlink(prv, nxt, head, tail, 0, v)
                res[v] = 0
                scal[USED] -= size[v]
                if record:
                    evbuf[n_ev] = v
                n_ev += 1
            push_head(prv, nxt, head, tail, 0, x)
            res[x] = 1
            freq[x] = 0
            size[x] = sz
            pin[x] = sid
            pinned += sz
            scal[USED] += sz
    return n_ev


@register("clock", "CLOCK / second chance")
class Clock(CachePolicy):
    """CLOCK (second chance) with an n-bit reference counter."""

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1, *,
                 clock_bits: int = 1):
        super().__init__(capacity_bytes, n_items, item_bytes)
        self._scal[MAXF] = (1 << check_int(clock_bits, "clock_bits", 1, 8)) - 1
        self._prv, self._nxt, self._head, self._tail = new_list_state(self.n_items, 1)
        self._freq = np.zeros(self.n_items, dtype=np.int64)

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        return clock_kernel(self._prv, self._nxt, self._head, self._tail, self._freq, self._res, self._size,
                            self._pin, self._scal, items, sizes, offsets, hit, evbuf, record)
