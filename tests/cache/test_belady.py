"""Belady: next-use keys, optimality against an exhaustive search, the step API."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from cache_helpers import csr, steps_strategy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cache import make_policy
from sim.cache.belady import Belady, next_use
from sim.errors import SimError

INF = np.iinfo(np.int64).max


def optimal_misses(steps: list[list[int]], capacity: int) -> int:
    """Fewest misses any schedule obeying the step model can have (unit sizes): keys a
    step finds resident stay through it, any subset of its misses may be kept, anything
    else may be dropped, at most ``capacity`` items after each step."""
    sets = [frozenset(s) for s in steps]

    @functools.cache
    def best(s: int, resident: frozenset) -> int:
        if s == len(sets):
            return 0
        hits = resident & sets[s]
        misses = sorted(sets[s] - resident)
        others = sorted(resident - sets[s])
        out = 10**9
        for n_in in range(len(misses) + 1):
            room = capacity - len(hits) - n_in
            if room < 0:
                break
            for ins in itertools.combinations(misses, n_in):
                for keep in itertools.combinations(others, min(room, len(others))):
                    out = min(out, best(s + 1, hits | frozenset(ins) | frozenset(keep)))
        return len(misses) + out

    return best(0, frozenset())


@settings(max_examples=80, deadline=None)
@given(stream=steps_strategy(max_items=5, max_steps=8, max_step=3), capacity=st.integers(1, 5))
def test_belady_is_optimal(stream, capacity):
    n, steps = stream
    items, offsets = csr(steps)
    got = make_policy("belady", capacity, n).run(items, offsets, next_use=next_use(items, offsets)).hit
    assert int((~got).sum()) == optimal_misses(steps, capacity)


def test_plain_next_step_ties_would_not_be_optimal():
    """Why next_use breaks ties by later uses: 0 and 2 are both next needed at step 3,
    but only 2 is needed again afterwards, so 2 must be the one kept."""
    steps = [[0, 2, 4], [3, 4, 5], [1, 4], [0, 2, 5], [4], [0, 4], [1, 3, 5], [4]]
    items, offsets = csr(steps)
    nu = next_use(items, offsets)
    got = make_policy("belady", 3, 6).run(items, offsets, next_use=nu).hit
    assert int((~got).sum()) == optimal_misses(steps, 3)


def test_next_use_with_one_key_per_step_is_the_next_index():
    keys = np.array([3, 1, 3, 2, 1, 3], dtype=np.int64)
    nu = next_use(keys, np.arange(7))
    assert np.where(nu == INF, -1, nu // 2).tolist() == [2, 4, 5, -1, -1, -1]


def test_next_use_orders_ties_by_the_following_use():
    items, offsets = csr([[0, 1], [0, 1], [1]])
    nu = next_use(items, offsets)
    assert nu[0] > nu[1]  # both next used in step 1; only key 1 is used again after that


def test_insert_everything_variant_never_beats_bypass():
    rng = np.random.default_rng(0)
    keys = (rng.zipf(1.2, 3000) - 1) % 200
    offsets = np.arange(keys.size + 1)
    nu = next_use(keys, offsets)
    for cap in (5, 30, 100):
        with_bypass = make_policy("belady", cap, 200).run(keys, offsets, next_use=nu).hit.sum()
        insert_all = make_policy("belady", cap, 200, bypass=False).run(keys, offsets, next_use=nu).hit.sum()
        assert with_bypass >= insert_all


def test_step_api_follows_a_prepared_future():
    steps = [[0, 1], [2], [0, 2], [1]]
    items, offsets = csr(steps)
    stepped = Belady(2, 3).prepare(items, offsets)
    hits = np.concatenate([stepped.step(np.array(s)).hit for s in steps])
    block = Belady(2, 3).run(items, offsets, next_use=next_use(items, offsets)).hit
    np.testing.assert_array_equal(hits, block)
    with pytest.raises(SimError, match="more steps"):
        stepped.step([0])


def test_step_api_checks_the_keys_and_needs_the_future():
    items, offsets = csr([[0, 1], [2]])
    with pytest.raises(SimError, match="prepare"):
        Belady(2, 3).step([0])
    with pytest.raises(SimError, match="other keys"):
        Belady(2, 3).prepare(items, offsets).step([1])
    with pytest.raises(SimError, match="offline"):
        Belady(2, 3).run(items, offsets)


def test_heap_is_rebuilt_on_long_streams():
    """Lazy heap entries pile up on hits; the periodic rebuild must keep results exact."""
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 6, 5000).astype(np.int64)
    offsets = np.arange(keys.size + 1)
    got = make_policy("belady", 3, 6).run(keys, offsets, next_use=next_use(keys, offsets)).hit
    lru = make_policy("lru", 3, 6).run(keys, offsets).hit
    assert got.sum() > lru.sum()
    # Belady with capacity 3 of 6 keys: a miss at most every other request on random keys
    assert (~got).sum() < 0.5 * keys.size
