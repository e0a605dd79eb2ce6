"""sim/cache/stack_distance.py: one pass gives LRU's misses at every cache size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cache.lru import LRU
from sim.cache.stack_distance import FIRST_USE, lru_misses, stack_distances
from sim.errors import SimError


def _steps(draw_keys: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    steps = [sorted(set(s)) for s in draw_keys if s]
    items = np.array([k for s in steps for k in s], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in steps])]).astype(np.int64)
    return items, offsets


def _replay_misses(items: np.ndarray, offsets: np.ndarray, n_items: int, size: int) -> int:
    return int(np.count_nonzero(~LRU(size, n_items, 1).run(items, offsets).hit))


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(0, 15), min_size=0, max_size=120))
def test_one_pass_misses_equal_an_lru_replay_at_every_size(keys):
    """One key per step (the classic cache model): the stack distances give the replay's misses
    at every size from 0 to all the keys."""
    items = np.array(keys, dtype=np.int64)
    offsets = np.arange(items.size + 1, dtype=np.int64)
    n_items = 16
    sizes = list(range(n_items + 2))
    got = lru_misses(stack_distances(items), sizes)
    assert list(got) == [_replay_misses(items, offsets, n_items, c) for c in sizes]


def _stack_lru_misses(steps: list[list[int]], size: int) -> int:
    """A plain list kept in recency order: the stack form of a batched step (look up, then
    move the step's keys to the top in request order, keep the top ``size``)."""
    stack: list[int] = []
    misses = 0
    for step in steps:
        resident = set(stack[:size])
        misses += sum(1 for k in step if k not in resident)
        stack = list(reversed(step)) + [k for k in stack if k not in step]
    return misses


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=5), max_size=30))
def test_batched_steps_follow_the_stack_form(steps):
    items, offsets = _steps(steps)
    clean = [sorted(set(s)) for s in steps if s]
    sizes = list(range(14))
    assert list(lru_misses(stack_distances(items, offsets), sizes)) == [_stack_lru_misses(clean, c) for c in sizes]


def test_the_engines_batched_lru_is_not_a_stack_algorithm():
    """Promoting a step's hits before its misses makes the recency order depend on the size: some
    stream has a request that hits in a small cache and misses in a larger one (so no one-pass
    curve can give the engine's LRU at another budget; sim.engine.reevaluate replays it)."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        steps = [list(rng.choice(10, rng.integers(1, 4), replace=False)) for _ in range(20)]
        items, offsets = _steps(steps)
        hits = {c: LRU(c, 10, 1).run(items, offsets).hit for c in range(3, 11)}
        if any(np.any(hits[c] & ~hits[c + 1]) for c in range(3, 10)):
            return
    raise AssertionError("no inclusion violation found")


def test_distances_count_distinct_keys_since_the_last_use():
    d = stack_distances(np.array([1, 2, 3, 2, 1, 1]))
    assert list(d) == [FIRST_USE, FIRST_USE, FIRST_USE, 1, 2, 0]


@pytest.mark.parametrize("items, offsets, field", [([1, -2], None, "items"), ([1, 2], [0, 3], "offsets"),
                                                    ([1.5], None, "items")])
def test_bad_input_is_a_one_line_error(items, offsets, field):
    with pytest.raises(SimError) as info:
        stack_distances(np.array(items), None if offsets is None else np.array(offsets))
    assert info.value.field == field
