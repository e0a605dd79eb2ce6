"""One recency list whose nodes live in rows of an ``int64`` array (array of structs).

LRU and the sliding window touch every requested item's links, size and (for the window)
last-use token. Keeping them in one row per item, ``node[x] = (prv, nxt, size, ...)``,
puts them in one cache line: on a Mixtral-sized trace (3.7 M items) this replays about
1.5x faster than separate arrays. A size of 0 means "not resident", so residency needs no
array of its own. ``head`` is the most recent end; the head and tail ids live in the
kernel's scalar array.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import FIRST_FREE, NONE

PRV, NXT, SIZE = 0, 1, 2
HEAD = FIRST_FREE
TAIL = FIRST_FREE + 1
AOS_FREE = FIRST_FREE + 2  # first scalar slot free for the policy


def new_nodes(n_items: int, columns: int = 3) -> np.ndarray:
    nodes = np.full((n_items, columns), NONE, dtype=np.int64)
    nodes[:, SIZE] = 0
    return nodes


@njit(cache=True)
def node_push_head(node, scal, x):
    h = scal[HEAD]
    node[x, PRV] = NONE
    node[x, NXT] = h
    if h != NONE:
        node[h, PRV] = x
    else:
        scal[TAIL] = x
    scal[HEAD] = x


@njit(cache=True)
def node_unlink(node, scal, x):
    p = node[x, PRV]
    n = node[x, NXT]
    if p != NONE:
        node[p, NXT] = n
    else:
        scal[HEAD] = n
    if n != NONE:
        node[n, PRV] = p
    else:
        scal[TAIL] = p


@njit(cache=True)
def node_pop_tail(node, scal):
    v = scal[TAIL]
    p = node[v, PRV]
    if p != NONE:
        node[p, NXT] = NONE
    else:
        scal[HEAD] = NONE
    scal[TAIL] = p
    return v
