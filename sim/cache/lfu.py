"""LFU: evict the least frequently used item; ties go to the one that reached that
frequency first (libCacheSim's ``LFU``). Frequencies restart at 1 on insertion.

Items hang in one FIFO list per frequency (O(1) per request). During the insert phase
of a step the eviction scan order (frequency up, oldest first) of the unpinned items
cannot change, so the scan resumes where the previous eviction of the step stopped and
a step with many misses never rescans its own pinned items.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, FIRST_FREE, NONE, STEP, USED, push_head, unlink
from sim.cache.base import CachePolicy, register

MINF = FIRST_FREE
MAXF = FIRST_FREE + 1


@njit(cache=True)
def _update_min(bhead, scal):
    f = scal[MINF] + 1
    while f <= scal[MAXF]:
        if bhead[f] != NONE:
            scal[MINF] = f
            return
        f += 1


@njit(cache=True)
def lfu_kernel(prv, nxt, bhead, btail, freq, res, size, pin, scal, items, sizes, offsets, hit, evbuf, record):
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
                f = freq[x]
                unlink(prv, nxt, bhead, btail, f, x)
                freq[x] = f + 1
                if f + 1 > scal[MAXF]:
                    scal[MAXF] = f + 1
                push_head(prv, nxt, bhead, btail, f + 1, x)
                if scal[MINF] == f and bhead[f] == NONE:
                    _update_min(bhead, scal)
            else:
                hit[i] = False
        cur_f = -1
        cur = NONE
        for i in range(lo, hi):
            if hit[i]:
                continue
            x = items[i]
            sz = sizes[i]
            if sz > cap - pinned:
                continue
            while scal[USED] + sz > cap:
                if cur_f < 0:
                    cur_f = scal[MINF]
                    cur = btail[cur_f]
                while cur == NONE or pin[cur] == sid:
                    if cur == NONE:
                        cur_f += 1
                        cur = btail[cur_f]
                    else:
                        cur = prv[cur]
                v = cur
                cur = prv[v]
                f = freq[v]
                unlink(prv, nxt, bhead, btail, f, v)
                if f == scal[MINF] and bhead[f] == NONE:
                    _update_min(bhead, scal)
                res[v] = 0
                scal[USED] -= size[v]
                if record:
                    evbuf[n_ev] = v
                n_ev += 1
            scal[MINF] = 1
            freq[x] = 1
            push_head(prv, nxt, bhead, btail, 1, x)
            res[x] = 1
            size[x] = sz
            pin[x] = sid
            pinned += sz
            scal[USED] += sz
    return n_ev


@register("lfu", "least frequently used (in-cache counts)")
class LFU(CachePolicy):
    """Least frequently used, FIFO among equal counts."""

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1):
        super().__init__(capacity_bytes, n_items, item_bytes)
        self._prv = np.full(self.n_items, NONE, dtype=np.int32)
        self._nxt = np.full(self.n_items, NONE, dtype=np.int32)
        self._freq = np.zeros(self.n_items, dtype=np.int64)
        self._bhead = np.full(64, NONE, dtype=np.int64)
        self._btail = np.full(64, NONE, dtype=np.int64)
        self._scal[MINF] = 1
        self._scal[MAXF] = 1

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        # A step raises any count by at most one: make sure the bucket arrays reach.
        need = int(self._scal[MAXF]) + offsets.shape[0] + 2
        if need > self._bhead.shape[0]:
            grow = max(need, 2 * self._bhead.shape[0])
            for name in ("_bhead", "_btail"):
                old = getattr(self, name)
                new = np.full(grow, NONE, dtype=np.int64)
                new[:old.shape[0]] = old
                setattr(self, name, new)
        return lfu_kernel(self._prv, self._nxt, self._bhead, self._btail, self._freq, self._res, self._size,
                          self._pin, self._scal, items, sizes, offsets, hit, evbuf, record)
