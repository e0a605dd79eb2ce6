"""window: keep what the last k tokens used (LLM in a Flash)."""

from __future__ import annotations

import numpy as np
from cache_helpers import csr, random_steps
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sim.cache import make_policy
from sim.cache.window import Window


def test_memory_is_the_union_of_the_last_k_tokens():
    rng = np.random.default_rng(2)
    steps = random_steps(rng, 50, 60, max_step=8)
    k = 3
    policy = Window(10**6, 50, window_tokens=k)
    for t, keys in enumerate(steps):
        policy.step(np.array(keys), token=t)
        expected = sorted(set().union(*map(set, steps[max(0, t - k):t + 1])))
        assert policy.resident().tolist() == expected


def test_a_neuron_used_k_tokens_ago_still_hits():
    policy = Window(100, 10, window_tokens=2)
    policy.step([1], token=0)
    policy.step([2], token=1)
    assert policy.step([1], token=2).hit.tolist() == [True]  # tokens 0 and 1 are the last two
    policy.step([3], token=3)
    policy.step([4], token=4)
    out = policy.step([1], token=5)  # last used at token 2: outside tokens 3..4
    assert out.hit.tolist() == [False]


def test_several_steps_per_token_share_the_window():
    policy = Window(100, 20, window_tokens=1)
    policy.step([1], token=0)  # layer 0
    policy.step([11], token=0)  # layer 1
    assert policy.step([1], token=1).hit.tolist() == [True]
    assert policy.step([11], token=1).hit.tolist() == [True]


def test_with_a_long_window_it_is_lru():
    rng = np.random.default_rng(3)
    items, offsets = csr(random_steps(rng, 40, 300, max_step=5))
    window = make_policy("window", 12, 40, window_tokens=10**6).run(items, offsets).hit
    lru = make_policy("lru", 12, 40).run(items, offsets).hit
    np.testing.assert_array_equal(window, lru)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, 11), max_size=6, unique=True), st.integers(1, 3),
                                st.integers(0, 2)), max_size=25),
       capacity=st.integers(0, 12), k=st.integers(1, 4), switch=st.integers(0, 25))
@example(steps=[([0, 1], 1, 3), ([2], 2, 0), ([3], 1, 2)], capacity=12, k=2, switch=1)  # rows turn sized at t=3
def test_one_size_rows_give_the_general_rows_hits_and_turn_general_on_another_size(steps, capacity, k, switch):
    """Items of one size keep (slot, last token) rows; the same blocks on a window whose rows
    carry sizes give the same hits and evictions (expiries included), also after a block that
    asks for other sizes (from step ``switch`` on), which turns the rows into sized ones."""
    n = 12
    one = Window(capacity, n, 1, window_tokens=k)
    sized = Window(capacity, n, np.array([1] * (n - 1) + [2]), window_tokens=k)  # rows of (size, slot, last)
    token = 0
    for i, (keys, size, gap) in enumerate(steps):
        token += gap
        items = np.array(keys, dtype=np.int64)
        sizes = np.full(items.size, size if i >= switch else 1, dtype=np.int64)
        offsets, tokens = np.array([0, items.size]), np.array([token])
        a = one.run(items, offsets, sizes=sizes, tokens=tokens, record_evictions=True)
        b = sized.run(items, offsets, sizes=sizes, tokens=tokens, record_evictions=True)
        assert a.hit.tolist() == b.hit.tolist()
        assert a.evicted.tolist() == b.evicted.tolist()
    np.testing.assert_array_equal(one.resident_mask(), sized.resident_mask())
