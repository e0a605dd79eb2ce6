"""static-hot: a fixed hot set from a profile; everything else bypasses the cache."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cache.static_hot import StaticHot, hot_set
from sim.errors import SimError


def test_hot_set_is_the_most_requested_that_fit():
    counts = np.array([5, 0, 9, 9, 1, 3])
    assert hot_set(counts, np.ones(6, np.int64), 3).tolist() == [True, False, True, True, False, False]
    # greedy by count: 2 (4 bytes) does not fit and is skipped; 3, 0 and 5 fill the 3 bytes
    sizes = np.array([1, 1, 4, 1, 1, 1])
    assert np.flatnonzero(hot_set(counts, sizes, 3)).tolist() == [0, 3, 5]


def test_never_evicts_and_bypasses_cold_items():
    policy = StaticHot(2, 6, profile_counts=np.array([0, 7, 0, 5, 0, 0]))
    assert policy.step([1, 2]).hit.tolist() == [False, False]
    assert policy.resident().tolist() == [1]  # hot 1 admitted, cold 2 bypassed
    for _ in range(3):
        out = policy.step([0, 2, 4, 5])
        assert out.evicted.size == 0 and not out.hit.any()
    assert policy.step([3]).hit.tolist() == [False]
    assert policy.step([1, 3]).hit.tolist() == [True, True]


def test_preload_starts_with_the_hot_set_resident():
    policy = StaticHot(2, 4, profile_counts=np.array([3, 2, 1, 0]), preload=True)
    assert policy.step([0, 1, 2]).hit.tolist() == [True, True, False]
    assert policy.used_bytes == 2


def test_needs_a_profile():
    with pytest.raises(SimError, match="profile"):
        StaticHot(2, 4)
