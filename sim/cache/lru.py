"""LRU: evict the least recently used item.

Hits and inserts become the most recent entry of a recency queue
(:mod:`sim.cache._recency`), so within a step every pinned item (hit or inserted in it) is
newer than any item not used in it and the oldest live entry is always evictable when
one exists: a step is O(keys), with no scanning and no pin marks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, NONE, STEP, USED
from sim.cache._recency import POS, QHEAD, QTAIL, SIZE, ensure_room, new_queue, new_rows, oldest, retouch, touch
from sim.cache.base import CachePolicy, register


@njit(cache=True)
def lru_kernel(node, q, scal, items, sizes, offsets, hit, evbuf, record, one_size):
    """The batched LRU. ``one_size`` > 0: every item has that size and a row is its ring slot
    alone (``NONE``: not resident), half the memory of a (size, slot) row, which the cold
    region's scattered lookups feel (1.5x faster on the engine's Mixtral stream, identical
    hits); 0: rows are (size, slot), a size of 0 meaning not resident."""
    uniform = one_size > 0
    col = 0 if uniform else POS
    absent = NONE if uniform else 0  # column 0 of an absent item's row
    n_ev = 0
    cap = scal[CAP]
    used = scal[USED]
    head = scal[QHEAD]
    tail = scal[QTAIL]
    for s in range(offsets.shape[0] - 1):
        lo = offsets[s]
        hi = offsets[s + 1]
        pinned = 0
        for i in range(lo, hi):
            x = items[i]
            if node[x, 0] != absent:
                hit[i] = True
                pinned += one_size if uniform else node[x, SIZE]
                tail = retouch(node, q, tail, x, col)
            else:
                hit[i] = False
        for i in range(lo, hi):
            if hit[i]:
                continue
            x = items[i]
            sz = one_size if uniform else sizes[i]
            if sz > cap - pinned:
                continue  # bypass: cannot fit next to this step's pinned items
            while used + sz > cap:
                v, head = oldest(q, head, tail)  # never pinned: pinned items are the newest
                head += 1  # its entry is consumed
                used -= one_size if uniform else node[v, SIZE]
                node[v, 0] = absent
                if record:
                    evbuf[n_ev] = v
                n_ev += 1
            if not uniform:
                node[x, SIZE] = sz
            tail = touch(node, q, tail, x, col)
            pinned += sz
            used += sz
    scal[STEP] += offsets.shape[0] - 1
    scal[USED] = used
    scal[QHEAD] = head
    scal[QTAIL] = tail
    return n_ev


@register("lru", "least recently used")
class LRU(CachePolicy):
    """Least recently used."""

    item_arrays = False
    plan_candidate = True  # [PI2 §4.3]'s cold-region policy
    pinned_curve = True

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1):
        super().__init__(capacity_bytes, n_items, item_bytes)
        max_bytes, min_bytes = self.size_bounds()
        # items of one size keep their ring slot alone (see lru_kernel) until a block asks for
        # another size, which turns the rows into (size, slot) for good
        self._one = self._one_size or 0
        self._node = (np.full((self.n_items, 1), NONE, dtype=np.int32 if self.n_items < 2**31 else np.int64)
                      if self._one else new_rows(self.n_items, max_item_bytes=max_bytes))
        self._queue = new_queue(self.n_items, self.capacity_bytes, min_bytes)

    def resident_mask(self) -> np.ndarray:
        if self._one:
            return self._node[:, 0] != NONE
        return self._node[:, SIZE] != 0  # a resident item has a size, an absent one 0

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        if self._one and sizes.size and (sizes[0] != self._one or np.any(sizes != self._one)):
            slots = self._node[:, 0]
            self._node = new_rows(self.n_items, max_item_bytes=max(self._one, int(sizes.max())))
            self._node[:, POS] = slots
            self._node[slots != NONE, SIZE] = self._one
            self._one = 0
        col = 0 if self._one else POS
        self._queue = ensure_room(self._node, self._queue, self._scal, items.shape[0], col)
        return lru_kernel(self._node, self._queue, self._scal, items, sizes, offsets, hit, evbuf, record, self._one)
