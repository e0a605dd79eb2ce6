"""A pinned-prefix LRU's misses at every (pinned size, LRU size), from one pass over a stream.

The engine's neuron cache (:class:`~sim.engine.neuron_cache.NeuronCache` with its default
LRU) pins the ``H`` most popular keys and runs the rest of the budget as an LRU of ``C``
keys, preloaded with the next ``C`` keys in popularity order. Both move with the budget, so
the LRU's own request stream (the keys ranked ``>= H``) changes with it, and Mattson's one
pass (:mod:`sim.cache.stack_distance`: one stream, every size) does not answer it. What
does: a request at token ``t`` whose key was last used at token ``s`` hits when at most ``C``
distinct unpinned keys (itself included) were used in tokens ``[s, t)``, its LRU stack
distance counted in whole tokens. For every ``(s, t)`` that count is a sum over the tokens
``u`` in between of the unpinned keys used at ``u`` and not again before ``t``: a table of
``(s, t)`` per rank bin, built once. So at any ``(H, C)`` each token has one threshold,
the oldest last use that still hits, and a segment's misses are its requests ranked ``>= H``
whose last use is older: counts read from a (segment, gap, rank) table. A key first used in
the window hits when it was preloaded and fewer than ``C`` keys are ahead of it: the distinct
keys used so far plus the preloaded ones the preload made more recent and no one used yet,
which gives rank thresholds per token (exact per segment, from its sorted ranks).

Where this differs from the engine's replay, each measured against it (tests and
benchmarks/analytic_reeval.py print the error):

- the engine serves a token's layers as consecutive steps, so a request's distance also
  counts the earlier layers of token ``t`` and not those of token ``s``: the two swap,
  equal on average;
- the distinct-key table is kept per rank bin (``RANK_BINS`` bins of equal key count) and
  interpolated within the bin holding ``H``; misses of reused keys are counted in gap bins
  (exact up to ``EXACT_GAPS`` tokens, wider beyond) and in bins of equal request mass in
  rank, interpolated;
- a reused key's own step counts half (about half of a step's keys are used before it).

A key first used in the window follows the preload's order exactly: the better ranked groups
of equal profile counts more recent, within a group the higher keys (``tie_starts``).

Requests are grouped in segments (a token's layer); each segment belongs to one token, and
the tokens are ``0 .. n_tokens - 1`` in order. A request may carry flag bits; counts are
asked for per *class*, a mask whose bits a request must all carry (0: every request).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

RANK_BINS = 128  # bins of the distinct-key table (equal key counts)
FIRST_BINS = 4096  # bins of the first-use table (equal key counts)
EXACT_GAPS = 16  # reuse gaps counted exactly, in tokens; wider bins beyond
REUSE_RANK_BINS = 64  # rank bins of the reuse table (equal request counts)


@njit(cache=True)
def _reuse(keys, seg_bounds, seg_token, rank_of, n_tokens, n_bins, first_bins):
    """One pass each way over the requests: per request its key's rank and the token of its
    key's previous use (-1 if none); the distinct-key difference table (request at u whose
    key is next used at n adds one to every (s, t) with s <= u < t <= n, per rank bin); first
    uses per (token, first-use rank bin); reuses per first-use rank bin."""
    n = keys.shape[0]
    n_keys = rank_of.shape[0]
    rank = np.empty(n, np.int32)
    prev = np.empty(n, np.int32)
    first_hist = np.zeros((n_tokens, first_bins), np.int64)
    reused_hist = np.zeros(first_bins, np.int64)
    last = np.full(n_keys, -1, np.int32)
    for g in range(seg_bounds.shape[0] - 1):
        t = seg_token[g]
        for i in range(seg_bounds[g], seg_bounds[g + 1]):
            k = keys[i]
            r = rank_of[k]
            rank[i] = r
            prev[i] = last[k]
            last[k] = t
            fb = min(np.int64(r) * first_bins // n_keys, first_bins - 1)
            if prev[i] < 0:
                first_hist[t, fb] += 1
            else:
                reused_hist[fb] += 1
    w = n_tokens + 1
    diff = np.zeros((n_bins, w, w), np.int64)
    last[:] = n_tokens
    for g in range(seg_bounds.shape[0] - 2, -1, -1):
        u = seg_token[g]
        for i in range(seg_bounds[g + 1] - 1, seg_bounds[g] - 1, -1):
            k = keys[i]
            last_t = min(last[k], n_tokens - 1)
            last[k] = u
            if last_t <= u:
                continue
            b = min(np.int64(rank[i]) * n_bins // n_keys, n_bins - 1)
            diff[b, 0, u + 1] += 1
            diff[b, 0, last_t + 1] -= 1
            diff[b, u + 1, u + 1] -= 1
            diff[b, u + 1, last_t + 1] += 1
    return rank, prev, diff, first_hist, reused_hist


@njit(cache=True)
def _reuse_table(seg_bounds, seg_token, prev, rank, flags, classes, gap_bin, rank_edges, n_gap_bins):
    """Per class and segment, the requests of reused keys whose gap bin and rank bin are at
    least (i, j): suffix sums over both (a last row and column of zeros)."""
    n_rank_bins = rank_edges.shape[0] - 1
    out = np.zeros((classes.shape[0], seg_bounds.shape[0] - 1, n_gap_bins + 1, n_rank_bins + 1), np.int32)
    for g in range(seg_bounds.shape[0] - 1):
        for i in range(seg_bounds[g], seg_bounds[g + 1]):
            if prev[i] < 0:
                continue
            gb = gap_bin[seg_token[g] - prev[i]]
            rb = np.searchsorted(rank_edges, rank[i], side="right") - 1
            for c in range(classes.shape[0]):
                if flags[i] & classes[c] == classes[c]:
                    out[c, g, gb, rb] += 1
        for c in range(classes.shape[0]):
            for a in range(n_gap_bins - 1, -1, -1):
                for b in range(n_rank_bins - 1, -1, -1):
                    out[c, g, a, b] += out[c, g, a + 1, b] + out[c, g, a, b + 1] - out[c, g, a + 1, b + 1]
    return out


@njit(cache=True)
def _class_counts(seg_bounds, flags, classes):
    """Per class and segment, its requests (those carrying all the class's bits)."""
    out = np.zeros((classes.shape[0], seg_bounds.shape[0] - 1), np.int64)
    for g in range(seg_bounds.shape[0] - 1):
        for i in range(seg_bounds[g], seg_bounds[g + 1]):
            for c in range(classes.shape[0]):
                if flags[i] & classes[c] == classes[c]:
                    out[c, g] += 1
    return out


@njit(cache=True)
def _sorted_ranks(seg_bounds, rank, flags, cls, prev, first_only):
    """Per segment the sorted ranks of class ``cls``'s requests (only first uses if
    ``first_only``): (offsets, ranks)."""
    offsets = np.zeros(seg_bounds.shape[0], np.int64)
    for g in range(seg_bounds.shape[0] - 1):
        n = 0
        for i in range(seg_bounds[g], seg_bounds[g + 1]):
            n += (flags[i] & cls) == cls and (prev[i] < 0 or not first_only)
        offsets[g + 1] = offsets[g] + n
    out = np.empty(offsets[-1], np.int32)
    for g in range(seg_bounds.shape[0] - 1):
        m = offsets[g]
        for i in range(seg_bounds[g], seg_bounds[g + 1]):
            if (flags[i] & cls) == cls and (prev[i] < 0 or not first_only):
                out[m] = rank[i]
                m += 1
        out[offsets[g]:m] = np.sort(out[offsets[g]:m])
    return offsets, out


@njit(cache=True)
def _at_least(offsets, ranks, threshold):
    """Per segment, its sorted ranks at or above ``threshold[g]``."""
    out = np.empty(offsets.shape[0] - 1, np.int64)
    for g in range(offsets.shape[0] - 1):
        lo, hi = offsets[g], offsets[g + 1]
        out[g] = hi - lo - np.searchsorted(ranks[lo:hi], threshold[g])
    return out


def _gap_edges(n_tokens: int) -> np.ndarray:
    """Lower edges of the gap bins: 1 .. EXACT_GAPS one token wide, then about 1.25x wider each
    (the last edge at or past the tokens)."""
    edges = list(range(1, EXACT_GAPS + 2))
    while edges[-1] < n_tokens:
        edges.append(max(edges[-1] + 1, int(edges[-1] * 1.25)))
    return np.array(edges, dtype=np.int64)


@dataclass(frozen=True)
class PinnedLRUCurve:
    """What a stream's misses at any (pinned, capacity) are read from (see the module docstring)."""

    n_keys: int
    n_tokens: int
    seg_token: np.ndarray  # (segments,) token of each segment
    distinct: np.ndarray  # (RANK_BINS + 1, T, T): distinct keys ranked >= bin edge b used in [s, t)
    steps_per_token: float  # segments a token (served one after another: a token's layers)
    tie_starts: np.ndarray  # first rank of each group of equal popularity (the preload's recency ties)
    first_used: np.ndarray  # (T, FIRST_BINS + 1): keys ranked < edge first used before token t
    gap_edges: np.ndarray  # lower edges of the gap bins, and one past the last
    rank_edges: np.ndarray  # edges of the reuse table's rank bins
    reuse: np.ndarray  # (classes, segments, gap bins + 1, rank bins + 1): suffix sums (gap >=, rank >=)
    classes: tuple[int, ...]
    first_ranks: dict[int, tuple[np.ndarray, np.ndarray]]  # class -> _sorted_ranks of its first uses
    ranks: dict[int, tuple[np.ndarray, np.ndarray]]  # counted class -> _sorted_ranks of its requests
    totals: dict[int, np.ndarray]  # class -> requests per segment

    @classmethod
    def build(cls, keys: np.ndarray, seg_bounds: np.ndarray, seg_token: np.ndarray, n_tokens: int,
              rank_of: np.ndarray, flags: np.ndarray, classes: tuple[int, ...],
              counted: tuple[int, ...] = (), tie_starts: np.ndarray | None = None) -> PinnedLRUCurve:
        """From the requests (``keys[seg_bounds[g]:seg_bounds[g + 1]]`` is segment ``g``, at token
        ``seg_token[g]``), each key's popularity rank (0 the most popular) and the requests' flags.
        ``classes`` are those :meth:`misses` counts, ``counted`` more that only :meth:`below` and
        :attr:`totals` count. ``tie_starts``: the first rank of each run of keys the preload
        made most recent in descending rank order (equal popularity); default: none (every
        key its own)."""
        n_keys = int(rank_of.shape[0])
        seg_bounds = np.asarray(seg_bounds, dtype=np.int64)
        seg_token = np.asarray(seg_token, dtype=np.int64)
        rank, prev, diff, per_token, reused_hist = _reuse(np.asarray(keys), seg_bounds, seg_token,
                                                          np.asarray(rank_of, np.int32), n_tokens, RANK_BINS,
                                                          FIRST_BINS)
        per_bin = diff.cumsum(axis=1).cumsum(axis=2)[:, :n_tokens, :n_tokens]
        del diff
        distinct = np.zeros((RANK_BINS + 1, n_tokens, n_tokens))
        distinct[:-1] = per_bin[::-1].cumsum(axis=0)[::-1]
        before = np.zeros((n_tokens, FIRST_BINS + 1))
        before[1:, 1:] = per_token.cumsum(axis=0)[:-1].cumsum(axis=1)

        gap_edges = _gap_edges(n_tokens)
        gap_bin = np.searchsorted(gap_edges, np.arange(n_tokens + 1), side="right") - 1
        if n_keys <= REUSE_RANK_BINS:  # a bin per key: exact
            inner_edges = np.arange(1, n_keys)
        elif reused_hist.sum():
            hist = reused_hist.cumsum()
            want = np.linspace(0, hist[-1], REUSE_RANK_BINS + 1)[1:-1]
            inner = np.searchsorted(hist, want, side="left") + 1  # bin ends, in first-use bins
            inner_edges = (inner * n_keys) // FIRST_BINS
        else:
            inner_edges = np.zeros(0, dtype=np.int64)
        rank_edges = np.unique(np.concatenate([[0], inner_edges, [n_keys]])).astype(np.int64)
        flags = np.asarray(flags, dtype=np.uint8)
        reuse = _reuse_table(seg_bounds, seg_token, prev, rank, flags, np.asarray(classes, dtype=np.uint8), gap_bin,
                             rank_edges, gap_edges.size - 1)
        first_ranks = {c: _sorted_ranks(seg_bounds, rank, flags, np.uint8(c), prev, True) for c in classes}
        ranks = {c: _sorted_ranks(seg_bounds, rank, flags, np.uint8(c), prev, False) for c in counted}
        every = tuple(dict.fromkeys(classes + counted))
        totals = dict(zip(every, _class_counts(seg_bounds, flags, np.asarray(every, dtype=np.uint8)), strict=True))
        steps = max(seg_token.size / max(n_tokens, 1), 1.0)
        ties = np.arange(n_keys) if tie_starts is None else np.asarray(tie_starts, dtype=np.int64)
        return cls(n_keys, n_tokens, seg_token, distinct, steps, ties, before, gap_edges, rank_edges, reuse,
                   tuple(classes), first_ranks, ranks, totals)

    # -- queries ---------------------------------------------------------------------------
    def below(self, pinned: int, cls: int) -> np.ndarray:
        """Per segment, counted class ``cls``'s requests for keys ranked below ``pinned`` (the pinned ones)."""
        offsets, ranks = self.ranks[cls]
        return self.totals[cls] - _at_least(offsets, ranks, np.full(offsets.size - 1, pinned, np.int64))

    def _distinct_at(self, pinned: int) -> np.ndarray:
        """(s, t): distinct keys ranked >= ``pinned`` used in tokens [s, t), interpolated in rank."""
        x = pinned * RANK_BINS / self.n_keys
        b = min(int(x), RANK_BINS - 1)
        f = min(x - b, 1.0)
        return self.distinct[b] - f * (self.distinct[b] - self.distinct[b + 1])

    def _first_used(self, r: np.ndarray, t: int | slice = slice(None)) -> np.ndarray:
        """Keys ranked below each of ``r`` first used before token ``t`` (every token by
        default: then one row a token), interpolated within the first-use bins."""
        x = np.asarray(r, dtype=float) * FIRST_BINS / self.n_keys
        i = np.minimum(x.astype(np.int64), FIRST_BINS - 1)
        rows = self.first_used[t]
        return rows[..., i] + (x - i) * (rows[..., i + 1] - rows[..., i])

    def _first_use_misses(self, pinned: int, capacity: int, room: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per token (lo, hi, then): a key used first in the window misses when ranked in
        [lo, hi) or at or above ``then``.

        It was preloaded if ranked in [pinned, pinned + capacity), and the preload made the
        better tie groups (of equal profile counts) the more recent and, within a group, the
        higher ranks (the higher keys); ahead of it are every key used so far and the preloaded
        keys more recent than it that no one used yet. It hits while at most ``room[t]`` of
        the latter are ahead. So the groups hit whole up to the first where that many run out
        (the transition group), which hits from a rank on, and the later groups miss."""
        T = self.n_tokens
        end = pinned + capacity
        starts = np.clip(np.concatenate([self.tie_starts, [self.n_keys]]), pinned, end).astype(float)
        starts = np.unique(starts)
        unused = np.diff(starts)[None, :] - np.diff(self._first_used(starts), axis=1)  # (T, groups)
        ahead_after = np.cumsum(unused, axis=1)  # never-used preloaded keys up to each group's end
        lo, hi, then = np.full(T, end, np.int64), np.full(T, end, np.int64), np.full(T, end, np.int64)
        for t in range(T):
            over = np.flatnonzero(ahead_after[t] - 1 > room[t]) if starts.size > 1 else np.zeros(0, np.int64)
            if not over.size:
                continue  # every preloaded group still fits
            g = over[0]
            g0, g1 = starts[g], starts[g + 1]
            before = ahead_after[t, g] - unused[t, g]
            # within the group, the key ranked r has the unused keys ranked (r, g1) ahead of it
            edges = np.unique(np.concatenate([np.arange(np.ceil(g0 * FIRST_BINS / self.n_keys),
                                                         np.floor(g1 * FIRST_BINS / self.n_keys) + 1)
                                              * self.n_keys / FIRST_BINS, [g0, g1]]))
            edges = edges[(edges >= g0) & (edges <= g1)]
            at = self._first_used(np.concatenate([[g1], edges]), t)
            used_after = at[0] - at[1:]
            within = (g1 - edges - 1) - used_after  # nonincreasing in rank
            fits = np.flatnonzero(before + within <= room[t])
            r = g1 if not fits.size else edges[fits[0]]
            if fits.size and fits[0] > 0:  # between the last edge that misses and the first that fits
                a0, a1 = before + within[fits[0] - 1], before + within[fits[0]]
                frac = (a0 - room[t]) / (a0 - a1) if a0 > a1 else 1.0
                r = edges[fits[0] - 1] + frac * (edges[fits[0]] - edges[fits[0] - 1])
            lo[t], hi[t], then[t] = int(g0), int(np.ceil(r)), int(g1)
        return lo, hi, then

    def misses(self, pinned: int, capacity: int) -> dict[int, np.ndarray]:
        """Per class, per segment: misses (float counts) with the ``pinned`` most popular keys
        pinned and an LRU of ``capacity`` keys, preloaded with the next ones, for the rest."""
        T, steps = self.n_tokens, self.steps_per_token
        dist = self._distinct_at(pinned)
        # a reused key's own step: about half of its keys were used before it (STEP_HALF)
        own_token = dist - np.vstack([dist[1:], np.zeros((1, T))])
        s = np.arange(T)[:, None]
        fits = (dist - own_token / (2 * steps) <= capacity) & (s < np.arange(T)[None, :])
        oldest_hit = np.where(fits.any(axis=0), fits.argmax(axis=0), np.arange(T))  # a reuse from s >= it hits
        longest_hit_gap = np.arange(T) - oldest_hit

        first_miss = self._first_use_misses(pinned, capacity, capacity - 1 - dist[0])
        seg_t = self.seg_token
        # reused keys: those last used more than longest_hit_gap tokens ago, ranked >= pinned
        gap = longest_hit_gap[seg_t] + 1
        gi = np.searchsorted(self.gap_edges, gap, side="right") - 1
        gi = np.minimum(gi, self.gap_edges.size - 2)
        g_lo, g_hi = self.gap_edges[gi], self.gap_edges[gi + 1]
        gf = np.clip((gap - g_lo) / (g_hi - g_lo), 0.0, 1.0)
        qi = min(int(np.searchsorted(self.rank_edges, pinned, side="right")) - 1, self.rank_edges.size - 2)
        qf = (pinned - self.rank_edges[qi]) / (self.rank_edges[qi + 1] - self.rank_edges[qi])
        segs = np.arange(seg_t.size)
        out = {}
        for k, c in enumerate(self.classes):
            tab = self.reuse[k]
            near = tab[segs, gi, qi] * (1 - qf) + tab[segs, gi, qi + 1] * qf
            far = tab[segs, gi + 1, qi] * (1 - qf) + tab[segs, gi + 1, qi + 1] * qf
            reused = near * (1 - gf) + far * gf
            offsets, ranks = self.first_ranks[c]
            lo, hi, then = (_at_least(offsets, ranks, x[seg_t]) for x in first_miss)
            out[c] = reused + lo - hi + then
        return out
