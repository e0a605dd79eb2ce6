"""window: keep what the last k tokens used (LLM in a Flash)."""

from __future__ import annotations

import numpy as np
from cache_helpers import csr, random_steps

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
