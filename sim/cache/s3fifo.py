"""S3-FIFO (Yang et al., SOSP'23), as in libCacheSim's ``S3FIFO``.

A small FIFO (10% of the bytes) filters one-hit wonders; a main FIFO with a 2-bit
CLOCK counter holds the rest; a ghost FIFO (90%, ids only) remembers what the small
queue evicted. Inserts go to the small queue (to main if the id is in the ghost, or
while the small queue is full before the first eviction); an item leaving the small
queue moves to main if it was hit at least ``move_to_main_threshold`` times, otherwise
it goes to the ghost. Objects not smaller than the small queue are not admitted
(unless their id is in the ghost), exactly as libCacheSim does.

Pinned items reaching the tail of either queue are rotated to its head unchanged.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, FIRST_FREE, STEP, USED, new_list_state, push_head, unlink
from sim.cache.base import GHOST, CachePolicy, int64_bytes, register
from sim.checks import check_int, check_real

SMALL_CAP = FIRST_FREE
MAIN_CAP = FIRST_FREE + 1
GHOST_CAP = FIRST_FREE + 2
SMALL_USED = FIRST_FREE + 3
MAIN_USED = FIRST_FREE + 4
GHOST_USED = FIRST_FREE + 5
HAS_EVICTED = FIRST_FREE + 6
THRESH = FIRST_FREE + 7
N_SMALL = FIRST_FREE + 8
N_MAIN = FIRST_FREE + 9

Q_SMALL, Q_MAIN, Q_GHOST = 0, 1, 2
R_SMALL, R_MAIN, R_GHOST = 1, 2, GHOST


@njit(cache=True, inline="always")
def _ghost_add(prv, nxt, head, tail, res, size, ghost_cap, ghost_used, x):
    """Remember ``x`` in the ghost queue (evicting the oldest ghosts to fit); returns the ghost
    queue's bytes after."""
    sz = size[x]
    if sz > ghost_cap:
        res[x] = 0
        return ghost_used
    while ghost_used + sz > ghost_cap:
        g = tail[Q_GHOST]
        unlink(prv, nxt, head, tail, Q_GHOST, g)
        res[g] = 0
        ghost_used -= size[g]
    push_head(prv, nxt, head, tail, Q_GHOST, x)
    res[x] = R_GHOST
    return ghost_used + sz


@njit(cache=True)
def s3fifo_kernel(prv, nxt, head, tail, freq, res, size, pin, scal, items, sizes, offsets, hit, evbuf, record):
    # The scalar state lives in locals for the call (written back at the end): kept in
    # registers, where slots of ``scal`` would be reloaded after every store to an array
    # the compiler cannot prove distinct. A llama.cpp page cache steps once per chunk.
    n_ev = 0
    cap = scal[CAP]
    thresh = scal[THRESH]
    small_cap = scal[SMALL_CAP]
    main_cap = scal[MAIN_CAP]
    ghost_cap = scal[GHOST_CAP]
    used = scal[USED]
    small_used = scal[SMALL_USED]
    main_used = scal[MAIN_USED]
    ghost_used = scal[GHOST_USED]
    n_small = scal[N_SMALL]
    n_main = scal[N_MAIN]
    has_evicted = scal[HAS_EVICTED]
    sid = scal[STEP]
    ghost_hit = np.zeros(items.shape[0], dtype=np.bool_)
    for s in range(offsets.shape[0] - 1):
        lo = offsets[s]
        hi = offsets[s + 1]
        pinned = 0
        pin_small = 0
        pin_main = 0
        for i in range(lo, hi):
            x = items[i]
            r = res[x]
            if r != 0 and r < R_GHOST:  # resident: small or main
                hit[i] = True
                pin[x] = sid
                pinned += size[x]
                freq[x] += 1
                if r == R_SMALL:
                    pin_small += 1
                else:
                    pin_main += 1
            else:
                hit[i] = False
                if r == R_GHOST:
                    unlink(prv, nxt, head, tail, Q_GHOST, x)
                    res[x] = 0
                    ghost_used -= size[x]
                    ghost_hit[i] = True
        for i in range(lo, hi):
            if hit[i]:
                continue
            x = items[i]
            sz = sizes[i]
            if sz > cap - pinned or sz > small_cap:
                continue
            while used + sz > cap:
                has_evicted = 1
                small_free = n_small - pin_small
                main_free = n_main - pin_main
                use_main = main_used > main_cap or small_used == 0
                if use_main and main_free == 0:
                    use_main = False
                elif not use_main and small_free == 0:
                    use_main = True
                if use_main:
                    while True:
                        v = tail[Q_MAIN]
                        unlink(prv, nxt, head, tail, Q_MAIN, v)
                        if pin[v] == sid:
                            push_head(prv, nxt, head, tail, Q_MAIN, v)
                        elif freq[v] >= 1:
                            f = freq[v]
                            if f > 3:
                                f = 3
                            freq[v] = f - 1
                            push_head(prv, nxt, head, tail, Q_MAIN, v)
                        else:
                            res[v] = 0
                            main_used -= size[v]
                            n_main -= 1
                            used -= size[v]
                            if record:
                                evbuf[n_ev] = v
                            n_ev += 1
                            break
                else:
                    while n_small - pin_small > 0:
                        v = tail[Q_SMALL]
                        unlink(prv, nxt, head, tail, Q_SMALL, v)
                        if pin[v] == sid:
                            push_head(prv, nxt, head, tail, Q_SMALL, v)
                            continue
                        small_used -= size[v]
                        n_small -= 1
                        if freq[v] >= thresh:
                            push_head(prv, nxt, head, tail, Q_MAIN, v)
                            res[v] = R_MAIN
                            freq[v] = 0
                            main_used += size[v]
                            n_main += 1
                        else:
                            used -= size[v]
                            if record:
                                evbuf[n_ev] = v
                            n_ev += 1
                            if ghost_cap > 0:
                                ghost_used = _ghost_add(prv, nxt, head, tail, res, size, ghost_cap, ghost_used, v)
                            else:
                                res[v] = 0
                            break
            if not ghost_hit[i] and sz >= small_cap:
                continue  # libCacheSim makes room, then refuses objects as large as the small queue
            size[x] = sz
            freq[x] = 0
            pin[x] = sid
            pinned += sz
            used += sz
            if ghost_hit[i] or (has_evicted == 0 and small_used >= small_cap):
                push_head(prv, nxt, head, tail, Q_MAIN, x)
                res[x] = R_MAIN
                main_used += sz
                n_main += 1
                pin_main += 1
            else:
                push_head(prv, nxt, head, tail, Q_SMALL, x)
                res[x] = R_SMALL
                small_used += sz
                n_small += 1
                pin_small += 1
        sid += 1
    scal[STEP] = sid
    scal[USED] = used
    scal[SMALL_USED] = small_used
    scal[MAIN_USED] = main_used
    scal[GHOST_USED] = ghost_used
    scal[N_SMALL] = n_small
    scal[N_MAIN] = n_main
    scal[HAS_EVICTED] = has_evicted
    return n_ev


@register("s3fifo", "S3-FIFO (SOSP'23)")
class S3FIFO(CachePolicy):
    """S3-FIFO: small probationary FIFO + main CLOCK-like FIFO + ghost FIFO."""

    plan_candidate = True  # scan-resistant where LRU is not: the one alternative a plan weighs

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1, *,
                 small_size_ratio: float = 0.1, ghost_size_ratio: float = 0.9, move_to_main_threshold: int = 2):
        super().__init__(capacity_bytes, n_items, item_bytes)
        small_ratio = check_real(small_size_ratio, "small_size_ratio", 0.0, 1.0, lo_open=True, hi_open=True)
        ghost_ratio = check_real(ghost_size_ratio, "ghost_size_ratio", 0.0)
        threshold = check_int(move_to_main_threshold, "move_to_main_threshold", 1)
        # Same integer arithmetic as libCacheSim (truncation of the small and ghost sizes);
        # a ghost larger than int64 bytes is an unbounded one.
        small = int(self.capacity_bytes * small_ratio)
        self._scal[SMALL_CAP] = small
        self._scal[MAIN_CAP] = self.capacity_bytes - small
        self._scal[GHOST_CAP] = int64_bytes(self.capacity_bytes * ghost_ratio)
        self._scal[THRESH] = threshold
        self._prv, self._nxt, self._head, self._tail = new_list_state(self.n_items, 3)
        self._freq = np.zeros(self.n_items, dtype=np.int64)

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        return s3fifo_kernel(self._prv, self._nxt, self._head, self._tail, self._freq, self._res, self._size,
                             self._pin, self._scal, items, sizes, offsets, hit, evbuf, record)
