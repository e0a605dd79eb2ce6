"""Invariants every policy must keep, on random batched request streams (hypothesis)."""

from __future__ import annotations

import numpy as np
from cache_helpers import csr, steps_strategy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cache import POLICY_NAMES, make_policy
from sim.cache.belady import next_use


def build(name: str, cap: int, n: int, items: np.ndarray, offsets: np.ndarray, sizes=1):
    counts = np.bincount(items, minlength=n)
    policy = make_policy(name, cap, n, sizes, strict=False, profile_counts=counts, group_items=max(1, n // 2),
                         cluster_neurons=2, window_tokens=2)
    if name == "belady":
        policy.prepare(items, offsets)
    return policy


@settings(max_examples=120, deadline=None)
@given(stream=steps_strategy(), cap=st.integers(0, 12), name=st.sampled_from(POLICY_NAMES),
       size_seed=st.integers(0, 3))
def test_step_invariants(stream, cap, name, size_seed):
    """Occupancy <= capacity, hits + misses = requests, pinned keys never evicted, hits are
    exactly the keys resident when the step started, and hit keys stay resident."""
    n, steps = stream
    sizes = np.random.default_rng(size_seed).integers(1, 4, n) if size_seed else np.ones(n, dtype=np.int64)
    items, offsets = csr(steps)
    policy = build(name, cap, n, items, offsets, sizes)
    for token, keys in enumerate(steps):
        keys = np.array(keys, dtype=np.int64)
        if name == "window":
            policy.advance(token)  # items leave the window between tokens, not inside a step
        before = policy.resident_mask().copy()
        out = policy.step(keys, token=token)
        after = policy.resident_mask()
        assert policy.used_bytes <= cap
        assert out.hits + out.misses == keys.size
        assert not np.isin(out.evicted, keys).any(), "a pinned key was evicted in its own step"
        np.testing.assert_array_equal(out.hit, before[keys])
        assert after[keys[out.hit]].all()
        assert before[out.evicted].all() and not after[out.evicted].any()
        assert out.loaded_bytes >= int(sizes[keys[~out.hit]].sum()) if name == "pi2-segmented" else \
            out.loaded_bytes == int(sizes[keys[~out.hit]].sum())
        if name != "pi2-segmented":  # pi2 accounts whole hot clusters, not neurons
            assert policy.used_bytes == int(sizes[after].sum())


@settings(max_examples=60, deadline=None)
@given(stream=steps_strategy(max_items=7, max_steps=30), cap=st.integers(1, 7))
def test_belady_bounds_every_policy(stream, cap):
    """With unit sizes Belady has the fewest misses of all policies (and the fewest bytes
    read: pi2-segmented prefetches whole clusters, so for it bytes are what compare)."""
    n, steps = stream
    items, offsets = csr(steps)
    best = make_policy("belady", cap, n).run(items, offsets, next_use=next_use(items, offsets))
    best_misses = int((~best.hit).sum())
    for name in POLICY_NAMES:
        if name == "belady":
            continue
        out = build(name, cap, n, items, offsets).run(items, offsets)
        if name == "pi2-segmented":
            assert best.loaded_bytes.sum() <= out.loaded_bytes.sum(), name
        else:
            assert best_misses <= int((~out.hit).sum()), name


@settings(max_examples=60, deadline=None)
@given(stream=steps_strategy(max_items=10, max_steps=40, max_step=5))
def test_lru_hit_ratio_is_monotone_in_capacity(stream):
    n, steps = stream
    items, offsets = csr(steps)
    hits = [int(make_policy("lru", cap, n).run(items, offsets).hit.sum()) for cap in range(n + 2)]
    assert hits == sorted(hits)
    assert hits[-1] == items.size - np.unique(items).size  # big enough: only compulsory misses


@settings(max_examples=40, deadline=None)
@given(stream=steps_strategy(), cap=st.integers(1, 10), name=st.sampled_from(POLICY_NAMES))
def test_block_replay_equals_step_by_step(stream, cap, name):
    """The replay fast path (one kernel call for many steps) and the engine's per-step
    calls are the same computation."""
    n, steps = stream
    items, offsets = csr(steps)
    one = build(name, cap, n, items, offsets)
    block = one.run(items, offsets, next_use=next_use(items, offsets) if name == "belady" else None)
    other = build(name, cap, n, items, offsets)
    stepped = np.concatenate([other.step(np.array(s)).hit for s in steps])
    np.testing.assert_array_equal(block.hit, stepped)
    assert one.used_bytes == other.used_bytes


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), profile_seed=st.integers(0, 2**16), pct=st.sampled_from(["10%", "25%", "50%"]))
def test_belady_bounds_every_policy_given_another_profile(seed, profile_seed, pct):
    """`sim cache compare --profile` (issue 18): whatever trace the profile comes from, no policy
    reads fewer flash bytes than Belady, and no policy that loads only what a step requests has
    fewer misses; pi2-segmented can have fewer neuron misses only by reading whole clusters."""
    from cache_helpers import toy_trace

    from sim.cache.compare import compare_trace

    trace, profile = toy_trace(seed=seed), toy_trace(seed=profile_seed)
    df = compare_trace(trace, "all", pct, neuron_bytes=4, profile=profile).set_index("policy")
    best = df.loc["belady"]
    for name, row in df.iterrows():
        assert row.loaded_bytes >= best.loaded_bytes, name
        if name != "pi2-segmented":
            assert row.misses >= best.misses, name


@settings(max_examples=80, deadline=None)
@given(stream=steps_strategy(), cap=st.integers(0, 12), name=st.sampled_from(POLICY_NAMES),
       size_seed=st.integers(0, 3), per_token=st.integers(1, 3))
def test_per_step_block_is_one_run_per_step(stream, cap, name, size_seed, per_token):
    """``run(per_step=True)`` serves a block exactly as one ``run`` per step would, and its
    per-step ends are the evictions so far and the bytes resident after each step."""
    n, steps = stream
    sizes = np.random.default_rng(size_seed).integers(1, 4, n) if size_seed else np.ones(n, dtype=np.int64)
    items, offsets = csr(steps)
    tokens = np.arange(len(steps), dtype=np.int64) // per_token  # several steps a token, as a token's layers
    future = next_use(items, offsets) if name == "belady" else None
    one, block = build(name, cap, n, items, offsets, sizes), build(name, cap, n, items, offsets, sizes)
    hits, evicted, ends, used = [], [], [], []
    for s in range(len(steps)):
        lo, hi = offsets[s], offsets[s + 1]
        r = one.run(items[lo:hi], np.array([0, hi - lo]), tokens=tokens[s:s + 1], record_evictions=True,
                    next_use=None if future is None else future[lo:hi])
        hits.append(r.hit)
        evicted.append(r.evicted)
        ends.append(sum(e.size for e in evicted))
        used.append(one.used_bytes)
    out = block.run(items, offsets, tokens=tokens, record_evictions=True, next_use=future, per_step=True)
    np.testing.assert_array_equal(out.hit, np.concatenate(hits) if hits else np.zeros(0, bool))
    np.testing.assert_array_equal(out.evicted, np.concatenate(evicted) if evicted else np.zeros(0, np.int64))
    np.testing.assert_array_equal(out.evicted_ends, ends)
    np.testing.assert_array_equal(out.used_ends, used)
    assert out.n_evicted == (ends[-1] if ends else 0)
