"""LFU: least frequent first, FIFO among equal counts, counts restart on insertion."""

from __future__ import annotations

import numpy as np

from sim.cache.lfu import LFU


def test_evicts_least_frequent_and_oldest_among_ties():
    lfu = LFU(3, 10)
    for k in (1, 2, 3, 1, 1, 3):  # counts: 1 -> 3, 2 -> 1, 3 -> 2
        lfu.step([k])
    assert lfu.step([4]).evicted.tolist() == [2]
    assert lfu.step([5]).evicted.tolist() == [4]  # 4 and 5 both at count 1: 4 arrived first


def test_count_restarts_after_eviction():
    lfu = LFU(2, 10)
    for k in (1, 1, 1, 2, 3):  # 2 (count 1) evicted for 3
        lfu.step([k])
    lfu.step([2])  # 3 (count 1, older) evicted; 2 comes back with count 1, not 2
    assert lfu.step([4]).evicted.tolist() == [2]


def test_counts_beyond_the_initial_bucket_table():
    """A key requested in hundreds of steps outgrows the 64 preallocated buckets."""
    lfu = LFU(2, 4)
    for _ in range(300):
        lfu.step([0])
    for k in (1, 2, 3):
        out = lfu.step([k])
        assert 0 not in out.evicted.tolist()
    assert lfu.resident().tolist() == [0, 3]


def test_many_misses_in_one_step_evict_in_frequency_order():
    lfu = LFU(6, 20)
    for step in ([0, 1, 2, 3, 4, 5], [0, 1, 2], [0, 1], [0]):
        lfu.step(step)
    out = lfu.step([10, 11, 12, 13])  # counts: 0:4 1:3 2:2 3..5:1
    assert out.evicted.tolist() == [3, 4, 5, 2]
    assert np.array_equal(np.sort(lfu.resident()), [0, 1, 10, 11, 12, 13])
