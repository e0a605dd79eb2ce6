"""pi2-segmented: hot clusters under LRU, cold neurons under LRU."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cache.pi2_segmented import Pi2Segmented, hot_clusters
from sim.errors import SimError


def test_hot_neurons_form_clusters_within_groups_hottest_first():
    counts = np.array([9, 1, 8, 7, 0, 6,   5, 9, 4, 0, 3, 2])  # two groups of 6
    cluster_of, cluster_bytes, _ = hot_clusters(counts, np.ones(12, np.int64), hot_bytes=8, cluster_neurons=2,
                                                group_items=6)
    # hot: 0,7 (9) 2 (8) 3 (7) 5 (6) 6 (5) 8 (4) 10 (3); group 0: 0,2,3,5 ; group 1: 7,6,8,10
    assert cluster_of.tolist() == [0, -1, 0, 1, -1, 1, 2, 2, 3, -1, 3, -1]
    assert cluster_bytes.tolist() == [2, 2, 2, 2]


def test_a_hot_miss_loads_its_whole_cluster():
    counts = np.array([10, 10, 10, 10, 1, 1, 1, 1])
    policy = Pi2Segmented(24, 8, item_bytes=3, profile_counts=counts, hot_fraction=0.5, cluster_neurons=2)
    assert policy.n_clusters == 2
    out = policy.step([0])
    assert out.loaded_bytes == 6  # neuron 0 and its cluster mate
    out = policy.step([1, 4])
    assert out.hit.tolist() == [True, False] and out.loaded_bytes == 3
    assert policy.used_bytes == 9


def test_regions_have_separate_lru_capacities():
    counts = np.array([10, 10, 10, 10, 1, 1, 1, 1, 1])
    policy = Pi2Segmented(8, 9, profile_counts=counts, hot_fraction=0.5, cluster_neurons=2)
    for k in (4, 5, 6, 7):  # cold neurons only: at most the 4 cold bytes are used
        policy.step([k])
    assert policy.cold.used_bytes == 4 and policy.hot.used_bytes == 0
    out = policy.step([0, 2])  # two hot clusters
    assert out.evicted.size == 0 and policy.used_bytes == 8
    out = policy.step([8])  # cold LRU evicts the least recent cold neuron, hot clusters stay
    assert out.evicted.tolist() == [4]


def test_evicted_hot_cluster_is_reported_as_its_neurons():
    counts = np.array([10, 9, 8, 7, 0, 0])
    policy = Pi2Segmented(4, 6, profile_counts=counts, hot_fraction=0.5, cluster_neurons=2, hot_set_factor=2.0)
    policy.step([0])
    out = policy.step([2])
    assert sorted(out.evicted.tolist()) == [0, 1]


def test_needs_a_profile():
    with pytest.raises(SimError, match="profile"):
        Pi2Segmented(4, 6)
