"""CLOCK: second chance for referenced items."""

from __future__ import annotations

import pytest

from sim.cache.clock import Clock
from sim.errors import SimError


def test_referenced_item_gets_a_second_chance():
    clock = Clock(3, 10)
    for k in (1, 2, 3, 1):
        clock.step([k])
    assert clock.step([4]).evicted.tolist() == [2]  # 1 was referenced: moved to the head, bit cleared
    assert clock.step([5]).evicted.tolist() == [3]
    assert clock.step([6]).evicted.tolist() == [1]


def test_two_bit_counter_survives_two_sweeps():
    clock = Clock(2, 10, clock_bits=2)
    for k in (1, 1, 1, 2):  # 1 has counter 2 (saturates at 3)
        clock.step([k])
    assert clock.step([3]).evicted.tolist() == [2]
    assert clock.step([4]).evicted.tolist() == [3]
    assert 1 in clock.resident().tolist()


def test_rejects_bad_counter_width():
    with pytest.raises(SimError, match="clock_bits"):
        Clock(2, 10, clock_bits=0)
