"""Intrusive doubly linked lists over item-indexed arrays, for the numba policy kernels.

Every list-based policy (LRU, FIFO, CLOCK, SIEVE, S3-FIFO, ARC, LFU buckets) keeps its
queues as two ``int32`` arrays indexed by item id, ``prv`` (towards the head, the newest
end) and ``nxt`` (towards the tail, the oldest end), plus head/tail arrays indexed by list
number. An item is in at most one list at a time, so one ``prv``/``nxt`` pair serves all
lists of a policy. ``-1`` means "none". This keeps the per-request cost at a few array
writes with no Python objects, which is what lets a replay run at tens of millions of
requests per second.

The list helpers are inlined into each kernel: callers pass their list number as a
constant, and a helper compiled on its own gets one cached specialisation per constant, an
index that two processes compiling different kernels at once (``pytest -n 2`` on a fresh
checkout) left unusable (ARC's kernel then failed to type ``push_head`` for list 0).
"""

from __future__ import annotations

import numpy as np
from numba import njit

NONE = -1
INF = np.iinfo(np.int64).max  # "never requested again" for next-use times

# Common slots of every kernel's int64 scalar-state array.
USED = 0  # bytes resident
CAP = 1  # capacity in bytes
STEP = 2  # id of the next step (used to mark pinned items)
FIRST_FREE = 3  # first slot a policy may use for its own scalars


@njit(cache=True, inline="always")
def push_head(prv, nxt, head, tail, k, x):
    """Insert item ``x`` at the head (newest end) of list ``k``."""
    h = head[k]
    prv[x] = NONE
    nxt[x] = h
    if h != NONE:
        prv[h] = x
    else:
        tail[k] = x
    head[k] = x


@njit(cache=True, inline="always")
def unlink(prv, nxt, head, tail, k, x):
    """Remove item ``x`` from list ``k``."""
    p = prv[x]
    n = nxt[x]
    if p != NONE:
        nxt[p] = n
    else:
        head[k] = n
    if n != NONE:
        prv[n] = p
    else:
        tail[k] = p
    prv[x] = NONE
    nxt[x] = NONE


@njit(cache=True, inline="always")
def move_to_head(prv, nxt, head, tail, k, x):
    if head[k] != x:
        unlink(prv, nxt, head, tail, k, x)
        push_head(prv, nxt, head, tail, k, x)


def new_list_state(n_items: int, n_lists: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Arrays ``prv, nxt, head, tail`` for ``n_items`` items and ``n_lists`` lists."""
    prv = np.full(n_items, NONE, dtype=np.int32)
    nxt = np.full(n_items, NONE, dtype=np.int32)
    head = np.full(n_lists, NONE, dtype=np.int64)
    tail = np.full(n_lists, NONE, dtype=np.int64)
    return prv, nxt, head, tail
