"""sim/cache/pinned_lru_curve.py: a pinned-prefix LRU's misses at every (pinned, size) from one pass."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cache.lru import LRU
from sim.cache.pinned_lru_curve import EXACT_GAPS, PinnedLRUCurve

N_KEYS = 16  # at most a bin per key in every table: the curve's only approximations vanish
TOKENS = EXACT_GAPS + 1  # every gap counted exactly


def _replay(tokens: list[list[int]], rank_of: np.ndarray, pinned: int, size: int) -> np.ndarray:
    """Per token the misses of the cache the curve models, replayed: the ``pinned`` best ranked
    keys pinned, an LRU of ``size`` keys preloaded with the next ones (the best ranked most
    recent), each token one batched step."""
    by_rank = np.argsort(rank_of)
    lru = LRU(size, N_KEYS, 1)
    preload = by_rank[pinned:pinned + size][::-1].astype(np.int64)
    if size and preload.size:
        lru.run(preload, np.array([0, preload.size]))
    out = []
    for keys in tokens:
        cold = np.array([k for k in keys if rank_of[k] >= pinned], dtype=np.int64)
        out.append(int(np.count_nonzero(~lru.run(cold, np.array([0, cold.size])).hit)) if cold.size else 0)
    return np.array(out)


def _curve(tokens: list[list[int]], rank_of: np.ndarray) -> PinnedLRUCurve:
    keys = np.array([k for t in tokens for k in t], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum([len(t) for t in tokens])]).astype(np.int64)
    return PinnedLRUCurve.build(keys, bounds, np.arange(len(tokens)), len(tokens), rank_of,
                                np.zeros(keys.size, np.uint8), classes=(0,))


ranks = st.permutations(range(N_KEYS)).map(lambda p: np.array(p, dtype=np.int32))


@settings(max_examples=80, deadline=None)
@given(keys=st.lists(st.integers(0, N_KEYS - 1), min_size=1, max_size=TOKENS), rank_of=ranks,
       pinned=st.integers(0, N_KEYS), size=st.integers(0, N_KEYS))
def test_one_key_a_token_gives_the_replays_misses(keys, rank_of, pinned, size):
    """With one request a token the replay's step order cannot matter, and with a bin per key
    nothing is interpolated: the curve's misses are the replay's, token by token."""
    tokens = [[k] for k in keys]
    got = _curve(tokens, rank_of).misses(pinned, size)[0]
    assert np.allclose(got, _replay(tokens, rank_of, pinned, size))


@settings(max_examples=80, deadline=None)
@given(tokens=st.lists(st.lists(st.integers(0, N_KEYS - 1), min_size=1, max_size=5, unique=True).map(sorted),
                       min_size=1, max_size=TOKENS),
       rank_of=ranks, pinned=st.integers(0, N_KEYS), size=st.integers(0, N_KEYS))
def test_a_tokens_own_keys_are_all_its_distance_can_miss_by(tokens, rank_of, pinned, size):
    """Within a token the replay orders its keys (hits first); the curve counts about half of
    a reused key's own token as more recent than it. Either way a request's LRU distance is
    off by fewer than the token's keys, so the curve misses between what the replay misses
    with that many more places and with that many fewer."""
    curve = _curve(tokens, rank_of)
    slack = max(len(t) for t in tokens) - 1
    got = curve.misses(pinned, size)[0].sum()
    assert got >= _replay(tokens, rank_of, pinned, size + slack).sum() - 1e-9
    assert got <= _replay(tokens, rank_of, pinned, max(size - slack, 0)).sum() + 1e-9


def test_classes_count_the_requests_carrying_their_bits():
    tokens = [[0, 1, 2], [1, 2, 3], [0, 3]]
    keys = np.array([k for t in tokens for k in t], dtype=np.int64)
    flags = np.array([1, 0, 1, 1, 0, 0, 1, 1], dtype=np.uint8)
    bounds = np.array([0, 3, 6, 8])
    curve = PinnedLRUCurve.build(keys, bounds, np.arange(3), 3, np.arange(N_KEYS, dtype=np.int32), flags,
                                 classes=(0, 1), counted=(1,))
    assert list(curve.totals[0]) == [3, 3, 2]
    assert list(curve.totals[1]) == [2, 1, 2]
    assert list(curve.below(2, 1)) == [1, 1, 1]  # flagged requests for keys 0 and 1
    every, flagged = curve.misses(0, 0)[0], curve.misses(0, 0)[1]
    assert list(every) == [3, 3, 2] and list(flagged) == [2, 1, 2]  # no room: every request misses
