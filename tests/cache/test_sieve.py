"""SIEVE: the hand clears visited bits and stays where it evicted."""

from __future__ import annotations

from sim.cache.sieve import Sieve


def test_hand_skips_visited_and_keeps_its_position():
    sieve = Sieve(3, 10)
    for k in (1, 2, 3, 1):  # queue tail->head: 1(v) 2 3
        sieve.step([k])
    assert sieve.step([4]).evicted.tolist() == [2]  # clears 1, evicts 2, hand now at 3
    sieve.step([1])  # 1 visited again
    assert sieve.step([5]).evicted.tolist() == [3]  # hand continues from 3, not from the tail
    assert sieve.step([6]).evicted.tolist() == [4]  # wraps to the tail: 1 visited, cleared; next is 4


def test_one_hit_wonders_leave_before_reused_items():
    sieve = Sieve(4, 100)
    for k in (0, 1, 0, 1):
        sieve.step([k])
    for k in range(10, 30):  # a scan of keys seen once
        sieve.step([k])
        assert {0, 1} <= set(sieve.resident().tolist())
