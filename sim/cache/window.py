"""Sliding window (LLM in a Flash, Alizadeh et al. 2023, sec. 3.3): keep in DRAM the
neurons used by the last ``window_tokens`` tokens.

When a step of token ``t`` starts, every item last used before token
``t - window_tokens`` is dropped; items are otherwise kept in LRU order, and if the
window does not fit the capacity the least recently used go first (so at a large enough
capacity the memory used is exactly the window's working set, and at a small one the
policy is LRU). The paper uses k = 4 or 5; the default here is 5.

Dropping happens between tokens: the first step of a token first drops what left the
window (reported among that step's evictions, before its keys are looked up), or the
caller does it explicitly with :meth:`Window.advance`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, NONE, STEP, USED
from sim.cache._recency import (
    LAST,
    POS,
    QHEAD,
    QTAIL,
    RECENCY_FREE,
    SIZE,
    ensure_room,
    new_queue,
    oldest,
    resident,
    retouch,
    rows_for,
    rows_taking,
    touch,
)
from sim.cache.base import MAX_TOKEN, CachePolicy, register
from sim.checks import check_int

WINDOW = RECENCY_FREE


@njit(cache=True)
def window_kernel(node, q, scal, items, sizes, offsets, tokens, hit, evbuf, record, one_size):
    """The batched window. ``one_size`` > 0: every item has that size and a row is (slot, last
    token), ``NONE`` slot when not resident (8 bytes a row instead of 12, as
    :func:`~sim.cache.lru.lru_kernel`'s one-size rows); 0: rows are (size, slot, last token)."""
    uniform = one_size > 0
    col = POS - 1 if uniform else POS  # one-size rows lack the size column
    last = LAST - 1 if uniform else LAST
    absent = NONE if uniform else 0  # column 0 of an absent item's row
    n_ev = 0
    cap = scal[CAP]
    k = scal[WINDOW]
    used = scal[USED]
    head = scal[QHEAD]
    tail = scal[QTAIL]
    for s in range(offsets.shape[0] - 1):
        lo = offsets[s]
        hi = offsets[s + 1]
        t = tokens[s]
        # Expire: the queue is in recency order, so expired items are its oldest entries.
        while True:
            v, head = oldest(q, head, tail)
            if v == NONE or node[v, last] >= t - k:
                break
            head += 1  # its entry is consumed
            used -= one_size if uniform else node[v, SIZE]
            node[v, 0] = absent
            if record:
                evbuf[n_ev] = v
            n_ev += 1
        pinned = 0
        for i in range(lo, hi):
            x = items[i]
            if node[x, 0] != absent:
                hit[i] = True
                pinned += one_size if uniform else node[x, SIZE]
                node[x, last] = t
                tail = retouch(node, q, tail, x, col)
            else:
                hit[i] = False
        for i in range(lo, hi):
            if hit[i]:
                continue
            x = items[i]
            sz = one_size if uniform else sizes[i]
            if sz > cap - pinned:
                continue
            while used + sz > cap:
                v, head = oldest(q, head, tail)
                head += 1  # its entry is consumed
                used -= one_size if uniform else node[v, SIZE]
                node[v, 0] = absent
                if record:
                    evbuf[n_ev] = v
                n_ev += 1
            if not uniform:
                node[x, SIZE] = sz
            node[x, last] = t
            tail = touch(node, q, tail, x, col)
            pinned += sz
            used += sz
    scal[STEP] += offsets.shape[0] - 1
    scal[USED] = used
    scal[QHEAD] = head
    scal[QTAIL] = tail
    return n_ev


@register("window", "sliding window of the last k tokens (LLM in a Flash)")
class Window(CachePolicy):
    """Sliding window over the last ``window_tokens`` tokens (LRU beyond capacity)."""

    item_arrays = False

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1, *,
                 window_tokens: int = 5):
        super().__init__(capacity_bytes, n_items, item_bytes)
        self.window_tokens = check_int(window_tokens, "window_tokens", 1, MAX_TOKEN)
        self._scal[WINDOW] = self.window_tokens
        max_bytes, min_bytes = self.size_bounds()
        self._one = self._one_size or 0  # one size: (slot, last token) rows (see window_kernel)
        self._node = rows_for(self.n_items, 3, self._one, max_bytes)
        self._queue = new_queue(self.n_items, self.capacity_bytes, min_bytes)

    def advance(self, token: int) -> np.ndarray:
        """Start ``token``: drop the items last used before ``token - window_tokens``;
        returns their keys."""
        empty = np.zeros(0, dtype=np.int64)
        return self.step(empty, token=token).evicted

    def resident_mask(self) -> np.ndarray:
        return resident(self._node, self._one)

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        self._node, self._one = rows_taking(self._node, self._one, sizes)
        self._queue = ensure_room(self._node, self._queue, self._scal, items.shape[0], POS - (self._one > 0))
        return window_kernel(self._node, self._queue, self._scal, items, sizes, offsets, tokens, hit, evbuf, record,
                             self._one)
