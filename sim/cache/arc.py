"""ARC (Megiddo & Modha, FAST'03), as in libCacheSim's ``ARC`` (byte-based, float p).

T1 holds items seen once recently, T2 items seen at least twice; B1/B2 are their ghost
lists. A hit in B1 grows the target size ``p`` of T1, a hit in B2 shrinks it; the
REPLACE step evicts from T1 or T2 depending on ``p``. As in libCacheSim, eviction (and
REPLACE) only runs when the incoming item does not fit.

Hits move to the head of T2 and misses are inserted at the head of T1 or T2, so within a
step pinned items form a block at the heads and a pinned tail means the whole list is
pinned; the eviction then takes the other list's tail.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, FIRST_FREE, NONE, STEP, USED, move_to_head, new_list_state, push_head, unlink
from sim.cache.base import GHOST, CachePolicy, register

L1D = FIRST_FREE
L2D = FIRST_FREE + 1
L1G = FIRST_FREE + 2
L2G = FIRST_FREE + 3

T1, T2, B1, B2 = 0, 1, 2, 3
R_T1, R_T2, R_B1, R_B2 = 1, 2, GHOST, GHOST + 1


@njit(cache=True)
def _evictable(tail, pin, sid, k):
    t = tail[k]
    return t != NONE and pin[t] != sid


@njit(cache=True)
def _to_ghost(prv, nxt, head, tail, res, size, scal, k, sid, pin):
    """Move the tail of data list k (T1 or T2) to the head of its ghost list."""
    v = tail[k]
    unlink(prv, nxt, head, tail, k, v)
    sz = size[v]
    scal[USED] -= sz
    if k == T1:
        scal[L1D] -= sz
        scal[L1G] += sz
        push_head(prv, nxt, head, tail, B1, v)
        res[v] = R_B1
    else:
        scal[L2D] -= sz
        scal[L2G] += sz
        push_head(prv, nxt, head, tail, B2, v)
        res[v] = R_B2
    return v


@njit(cache=True)
def _replace(prv, nxt, head, tail, res, size, scal, p, in_b2, sid, pin):
    l1 = scal[L1D]
    from_t1 = (l1 > 0 and (l1 > p or (l1 == p and in_b2))) or scal[L2D] == 0
    if from_t1 and not _evictable(tail, pin, sid, T1):
        from_t1 = False
    elif not from_t1 and not _evictable(tail, pin, sid, T2):
        from_t1 = True
    return _to_ghost(prv, nxt, head, tail, res, size, scal, T1 if from_t1 else T2, sid, pin)


@njit(cache=True)
def _drop_ghost_tail(prv, nxt, head, tail, res, size, scal, k):
    g = tail[k]
    unlink(prv, nxt, head, tail, k, g)
    res[g] = 0
    if k == B1:
        scal[L1G] -= size[g]
    else:
        scal[L2G] -= size[g]


@njit(cache=True)
def arc_kernel(prv, nxt, head, tail, res, size, pin, scal, fscal, items, sizes, offsets, hit, evbuf, record):
    n_ev = 0
    cap = scal[CAP]
    ghost = np.zeros(items.shape[0], dtype=np.int8)  # 1: was in B1, 2: was in B2
    for s in range(offsets.shape[0] - 1):
        sid = scal[STEP]
        scal[STEP] = sid + 1
        lo = offsets[s]
        hi = offsets[s + 1]
        pinned = 0
        for i in range(lo, hi):
            x = items[i]
            r = res[x]
            if r == R_T1:
                hit[i] = True
                unlink(prv, nxt, head, tail, T1, x)
                push_head(prv, nxt, head, tail, T2, x)
                res[x] = R_T2
                scal[L1D] -= size[x]
                scal[L2D] += size[x]
            elif r == R_T2:
                hit[i] = True
                move_to_head(prv, nxt, head, tail, T2, x)
            else:
                hit[i] = False
                if r == R_B1:
                    delta = max(scal[L2G] / scal[L1G], 1.0)
                    fscal[0] = min(fscal[0] + delta, float(cap))
                    scal[L1G] -= size[x]
                    unlink(prv, nxt, head, tail, B1, x)
                    res[x] = 0
                    ghost[i] = 1
                elif r == R_B2:
                    delta = max(scal[L1G] / scal[L2G], 1.0)
                    fscal[0] = max(fscal[0] - delta, 0.0)
                    scal[L2G] -= size[x]
                    unlink(prv, nxt, head, tail, B2, x)
                    res[x] = 0
                    ghost[i] = 2
            if hit[i]:
                pin[x] = sid
                pinned += size[x]
        for i in range(lo, hi):
            if hit[i]:
                continue
            x = items[i]
            sz = sizes[i]
            if sz > cap - pinned:
                continue
            while scal[USED] + sz > cap:
                p = fscal[0]
                if ghost[i] != 0:
                    v = _replace(prv, nxt, head, tail, res, size, scal, p, ghost[i] == 2, sid, pin)
                elif scal[L1D] + scal[L1G] + sz > cap:
                    if scal[L1G] > 0:
                        _drop_ghost_tail(prv, nxt, head, tail, res, size, scal, B1)
                        v = _replace(prv, nxt, head, tail, res, size, scal, p, False, sid, pin)
                    elif _evictable(tail, pin, sid, T1):
                        v = tail[T1]
                        unlink(prv, nxt, head, tail, T1, v)
                        res[v] = 0
                        scal[L1D] -= size[v]
                        scal[USED] -= size[v]
                    else:
                        v = _replace(prv, nxt, head, tail, res, size, scal, p, False, sid, pin)
                else:
                    if scal[L1D] + scal[L1G] + scal[L2D] + scal[L2G] >= 2 * cap and scal[L2G] > 0:
                        _drop_ghost_tail(prv, nxt, head, tail, res, size, scal, B2)
                    v = _replace(prv, nxt, head, tail, res, size, scal, p, False, sid, pin)
                if record:
                    evbuf[n_ev] = v
                n_ev += 1
            size[x] = sz
            pin[x] = sid
            pinned += sz
            scal[USED] += sz
            if ghost[i] != 0:
                push_head(prv, nxt, head, tail, T2, x)
                res[x] = R_T2
                scal[L2D] += sz
            else:
                push_head(prv, nxt, head, tail, T1, x)
                res[x] = R_T1
                scal[L1D] += sz
    return n_ev


@register("arc", "adaptive replacement cache (FAST'03)")
class ARC(CachePolicy):
    """Adaptive replacement cache."""

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1):
        super().__init__(capacity_bytes, n_items, item_bytes)
        self._prv, self._nxt, self._head, self._tail = new_list_state(self.n_items, 4)
        self._fscal = np.zeros(1, dtype=np.float64)  # p, the adaptive target size of T1

    @property
    def p(self) -> float:
        return float(self._fscal[0])

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        return arc_kernel(self._prv, self._nxt, self._head, self._tail, self._res, self._size, self._pin,
                          self._scal, self._fscal, items, sizes, offsets, hit, evbuf, record)
