"""LRU, checked against a plain-Python model of the documented step semantics."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from cache_helpers import csr, random_steps
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cache import make_policy
from sim.cache.lru import LRU


def reference_lru(steps, capacity, sizes):
    """Phase 1: hits move to the MRU end (in request order). Phase 2: each miss evicts
    from the LRU end until it fits, or is bypassed if it cannot fit next to the pinned."""
    cache: OrderedDict[int, int] = OrderedDict()
    hits, evicted = [], []
    for keys in steps:
        pinned = 0
        step_hits = []
        for k in keys:
            if k in cache:
                cache.move_to_end(k)
                pinned += cache[k]
            step_hits.append(k in cache)
        for k, hit in zip(keys, step_hits, strict=True):
            if hit:
                continue
            if sizes[k] > capacity - pinned:
                continue
            while sum(cache.values()) + sizes[k] > capacity:
                evicted.append(cache.popitem(last=False)[0])
            cache[k] = sizes[k]
            pinned += sizes[k]
        hits.extend(step_hits)
    return np.array(hits), evicted


def test_matches_reference_model_on_batched_streams():
    rng = np.random.default_rng(0)
    for trial in range(20):
        n = int(rng.integers(5, 60))
        steps = random_steps(rng, n, 150, max_step=8)
        sizes = rng.integers(1, 5, n) if trial % 2 else np.ones(n, dtype=np.int64)
        capacity = int(rng.integers(1, 3 * n))
        ref_hits, ref_evicted = reference_lru(steps, capacity, sizes)
        policy = make_policy("lru", capacity, n, sizes)
        got_hits, got_evicted = [], []
        for keys in steps:
            out = policy.step(np.array(keys))
            got_hits.append(out.hit)
            got_evicted.extend(out.evicted.tolist())
        np.testing.assert_array_equal(np.concatenate(got_hits), ref_hits)
        assert got_evicted == ref_evicted


def test_evicts_least_recently_used():
    lru = LRU(3, 10)
    for k in (1, 2, 3, 1):
        lru.step([k])
    out = lru.step([4])
    assert out.evicted.tolist() == [2]
    assert sorted(lru.resident().tolist()) == [1, 3, 4]


def test_step_larger_than_capacity_bypasses_the_overflow():
    lru = LRU(2, 10)
    out = lru.step([0, 1, 2])
    assert out.hit.tolist() == [False, False, False]
    assert lru.resident().tolist() == [0, 1] and lru.used_bytes == 2
    assert out.loaded_bytes == 3  # all three were read from flash


def test_capacity_zero_caches_nothing():
    items, offsets = csr([[0, 1], [0, 1]])
    assert not LRU(0, 2).run(items, offsets).hit.any()


def test_recording_evictions_over_a_long_run_never_overflows_the_buffer():
    """A block can evict far more keys than there are items (evict, re-insert, evict again);
    the eviction buffer must hold them all (it once held only n_items + 1)."""
    import numpy as np

    from sim.cache import make_policy

    n_items, n_steps = 8, 2000
    rng = np.random.default_rng(0)
    items = rng.integers(0, n_items, n_steps).astype(np.int64)
    offsets = np.arange(n_steps + 1, dtype=np.int64)
    policy = make_policy("lru", capacity_bytes=2, n_items=n_items, item_bytes=1)
    out = policy.run(items, offsets, record_evictions=True)
    assert out.n_evicted > n_items + 1
    assert out.evicted is not None and out.evicted.shape[0] == out.n_evicted
    assert int(out.hit.sum()) + out.n_evicted <= n_steps


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, 11), max_size=6, unique=True), st.integers(1, 3)),
                      max_size=25),
       capacity=st.integers(0, 12), switch=st.integers(0, 25))
def test_one_size_rows_give_the_general_rows_hits_and_turn_general_on_another_size(steps, capacity, switch):
    """Items of one size keep a slot-only row; the same blocks on an LRU whose rows carry sizes
    give the same hits and evictions, also after a block that asks for other sizes (from step
    ``switch`` on), which turns the slot-only rows into sized ones."""
    n = 12
    one = LRU(capacity, n, 1)
    sized = LRU(capacity, n, np.array([1] * (n - 1) + [2]))  # not one size: rows of (size, slot)
    for i, (keys, size) in enumerate(steps):
        items = np.array(keys, dtype=np.int64)
        sizes = np.full(items.size, size if i >= switch else 1, dtype=np.int64)
        offsets = np.array([0, items.size])
        a = one.run(items, offsets, sizes=sizes, record_evictions=True)
        b = sized.run(items, offsets, sizes=sizes, record_evictions=True)
        assert a.hit.tolist() == b.hit.tolist()
        assert a.evicted.tolist() == b.evicted.tolist()
    np.testing.assert_array_equal(one.resident_mask(), sized.resident_mask())
