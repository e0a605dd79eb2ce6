"""Belady's MIN: evict the item whose next use is furthest in the future (offline).

The upper bound in every comparison. Time is measured in steps: the next use of a key is
the next step that requests it, ties between keys next requested by the same step broken
by their following uses (:func:`next_use`). Two variants:

- ``bypass=True`` (default): a miss whose next use is no sooner than that of every
  evictable item is not inserted (read, used, dropped), and the misses of a step are
  placed in order of next use. With unit sizes this is optimal (checked against an
  exhaustive search in tests/cache/test_belady.py), so it bounds every other policy,
  including those that bypass (static-hot); the property tests check that too.
- ``bypass=False``: every miss is inserted, evicting the furthest item, as in
  libCacheSim's ``Belady`` (used by the equality test).

With items of different sizes furthest-next-use is a heuristic (exact optimal caching
with sizes is NP-hard), still a useful bound in practice.

Resident items sit in a max-heap keyed by next use with lazy deletion; pinned items
popped during a step are set aside and pushed back when the step ends.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache._lists import CAP, FIRST_FREE, INF, STEP, USED
from sim.cache.base import CachePolicy, register
from sim.checks import check_bool
from sim.errors import SimError

HN = FIRST_FREE  # entries in the heap
BYPASS = FIRST_FREE + 1
CURSOR = FIRST_FREE + 2  # step index into a prepared future, for step() calls


def next_use(items: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per request, a key ordering it by the future of its item (INF: never again).

    The key sorts first by the next step requesting the item, then, for items next
    requested in the same step, by the step after that, and so on (lexicographic order
    of the items' future request steps). Plain next-step times tie whenever two items
    are next requested by the same batch, and with batches (pinned keys) the tie-break
    matters: furthest-in-future with this order matched an exhaustive search for the
    optimum on every small case tried, the plain next-step rule lost on about 4% of
    them. With one key per step the order is just the next-use time.
    """
    items = np.ascontiguousarray(items, dtype=np.int64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    steps = np.repeat(np.arange(offsets.shape[0] - 1, dtype=np.int64), np.diff(offsets))
    order = np.argsort(items, kind="stable")  # per key, requests stay in step order
    nxt = np.full(items.shape[0], -1, dtype=np.int64)
    same = items[order][1:] == items[order][:-1]
    nxt[order[:-1][same]] = order[1:][same]
    width = int(np.diff(offsets).max()) + 1 if offsets.shape[0] > 1 else 1
    return _future_keys(offsets, steps, nxt, width)


@njit(cache=True)
def _future_keys(offsets, steps, nxt, width):
    """Backwards over steps: key(r) = step(next(r)) * width + rank of next(r) in its step."""
    n = steps.shape[0]
    key = np.empty(n, dtype=np.int64)
    rank = np.zeros(n, dtype=np.int64)
    for s in range(offsets.shape[0] - 2, -1, -1):
        lo = offsets[s]
        hi = offsets[s + 1]
        for r in range(lo, hi):
            q = nxt[r]
            key[r] = INF if q < 0 else steps[q] * width + rank[q]
        order = np.argsort(key[lo:hi], kind="mergesort")
        dense = 0
        for j in range(order.shape[0]):
            if j > 0 and key[lo + order[j]] != key[lo + order[j - 1]]:
                dense += 1
            rank[lo + order[j]] = dense
    return key


@njit(cache=True)
def _sift_up(hk, hv, j):
    k = hk[j]
    v = hv[j]
    while j > 0:
        parent = (j - 1) >> 1
        if hk[parent] >= k:
            break
        hk[j] = hk[parent]
        hv[j] = hv[parent]
        j = parent
    hk[j] = k
    hv[j] = v


@njit(cache=True)
def _push(hk, hv, scal, key, item):
    j = scal[HN]
    hk[j] = key
    hv[j] = item
    scal[HN] = j + 1
    _sift_up(hk, hv, j)


@njit(cache=True)
def _pop(hk, hv, scal):
    n = scal[HN] - 1
    scal[HN] = n
    hk[0] = hk[n]
    hv[0] = hv[n]
    j = 0
    k = hk[0]
    v = hv[0]
    while True:
        c = 2 * j + 1
        if c >= n:
            break
        if c + 1 < n and hk[c + 1] > hk[c]:
            c += 1
        if hk[c] <= k:
            break
        hk[j] = hk[c]
        hv[j] = hv[c]
        j = c
    hk[j] = k
    hv[j] = v


@njit(cache=True)
def _rebuild(hk, hv, scal, res, nu):
    scal[HN] = 0
    for x in range(res.shape[0]):
        if res[x] != 0:
            _push(hk, hv, scal, nu[x], x)


@njit(cache=True)
def _top_evictable(hk, hv, scal, res, nu, pin, sid, stash, n_stash):
    """Drop stale heap entries and set aside pinned ones; the top is then the furthest
    evictable item. Returns the updated stash count."""
    while scal[HN] > 0:
        x = hv[0]
        if res[x] == 0 or nu[x] != hk[0]:
            _pop(hk, hv, scal)
        elif pin[x] == sid:
            stash[n_stash] = x
            n_stash += 1
            _pop(hk, hv, scal)
        else:
            break
    return n_stash


@njit(cache=True)
def belady_kernel(hk, hv, nu, stash, res, size, pin, scal, items, sizes, offsets, next_use, hit, evbuf, record):
    n_ev = 0
    cap = scal[CAP]
    bypass = scal[BYPASS] != 0
    for s in range(offsets.shape[0] - 1):
        sid = scal[STEP]
        scal[STEP] = sid + 1
        lo = offsets[s]
        hi = offsets[s + 1]
        if scal[HN] + (hi - lo) > hk.shape[0]:
            _rebuild(hk, hv, scal, res, nu)
        pinned = 0
        n_miss = 0
        for i in range(lo, hi):
            x = items[i]
            if res[x] != 0:
                hit[i] = True
                pin[x] = sid
                pinned += size[x]
                nu[x] = next_use[i]
                _push(hk, hv, scal, nu[x], x)
            else:
                hit[i] = False
                n_miss += 1
        if n_miss == 0:
            continue
        miss = np.empty(n_miss, dtype=np.int64)
        m = 0
        for i in range(lo, hi):
            if not hit[i]:
                miss[m] = i
                m += 1
        if bypass:
            miss = miss[np.argsort(next_use[miss], kind="mergesort")]
        n_stash = 0
        for m in range(n_miss):
            i = miss[m]
            x = items[i]
            sz = sizes[i]
            n = next_use[i]
            if sz > cap - pinned or (bypass and n == 9223372036854775807):
                continue
            admit = True
            while scal[USED] + sz > cap:
                n_stash = _top_evictable(hk, hv, scal, res, nu, pin, sid, stash, n_stash)
                v = hv[0]
                if bypass and nu[v] <= n:
                    admit = False
                    break
                _pop(hk, hv, scal)
                res[v] = 0
                scal[USED] -= size[v]
                if record:
                    evbuf[n_ev] = v
                n_ev += 1
            if not admit:
                continue
            res[x] = 1
            size[x] = sz
            nu[x] = n
            pin[x] = sid
            pinned += sz
            scal[USED] += sz
            _push(hk, hv, scal, n, x)
        for j in range(n_stash):
            _push(hk, hv, scal, nu[stash[j]], stash[j])
    return n_ev


@register("belady", "Belady's MIN (offline optimum, next use from the trace)")
class Belady(CachePolicy):
    """Belady's MIN, the offline optimum."""

    needs_future = True

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1, *,
                 bypass: bool = True):
        super().__init__(capacity_bytes, n_items, item_bytes)
        self._scal[BYPASS] = 1 if check_bool(bypass, "bypass") else 0
        self._nu = np.full(self.n_items, INF, dtype=np.int64)
        self._hk = np.zeros(2 * self.n_items + 16, dtype=np.int64)
        self._hv = np.zeros(2 * self.n_items + 16, dtype=np.int64)
        self._stash = np.zeros(self.n_items + 1, dtype=np.int64)
        self._future: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def prepare(self, items: np.ndarray, offsets: np.ndarray) -> Belady:
        """Give the whole future request stream, so :meth:`step` can be called without
        next-use times; each step must then request exactly the prepared keys."""
        items = np.ascontiguousarray(items, dtype=np.int64)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self._future = (items, offsets, next_use(items, offsets))
        self._scal[CURSOR] = 0
        return self

    def step(self, keys, sizes=None, *, token=None, next_use=None, check=True):
        if next_use is None:
            if self._future is None:
                raise SimError("belady needs the future: call prepare(items, offsets) first or pass next_use",
                               field="next_use")
            items, offsets, nu = self._future
            c = int(self._scal[CURSOR])
            if c >= offsets.shape[0] - 1:
                raise SimError("more steps than the prepared stream holds", field="keys")
            lo, hi = offsets[c], offsets[c + 1]
            keys = self._as_keys(keys)
            if not np.array_equal(keys, items[lo:hi]):
                raise SimError(f"step {c} requests other keys than the prepared stream", field="keys")
            self._scal[CURSOR] = c + 1
            next_use = nu[lo:hi]
        return super().step(keys, sizes, token=token, next_use=next_use, check=check)

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):
        if next_use.shape[0] != items.shape[0]:
            raise SimError("next_use must give one time per request", field="next_use")
        return belady_kernel(self._hk, self._hv, self._nu, self._stash, self._res, self._size, self._pin,
                             self._scal, items, sizes, offsets, next_use, hit, evbuf, record)
