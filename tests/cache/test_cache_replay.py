"""Key layout, trace -> request streams, whole-trace replay and the per-step StepwiseCache."""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import toy_trace

from sim.cache import make_policy
from sim.cache.layout import CacheLayout, RequestBlock
from sim.cache.replay import replay, replay_trace, trace_stream
from sim.cache.requests import read_requests_csv, requests_from_arrays
from sim.cache.stepwise import StepwiseCache
from sim.errors import SimError


@pytest.fixture(scope="module")
def trace():
    return toy_trace()


def test_neuron_keys_flatten_layer_expert_neuron():
    lay = CacheLayout(n_layers=3, n_experts=4, n_neurons=10)
    assert lay.neuron_keys(2, 1, [0, 9]).tolist() == [(2 * 4 + 1) * 10, (2 * 4 + 1) * 10 + 9]
    assert lay.n_items == 120 and lay.total_bytes == 120


def test_cluster_items_and_sizes():
    lay = CacheLayout(n_layers=1, n_experts=2, n_neurons=10, neuron_bytes=4, granularity="cluster",
                      cluster_neurons=4)
    assert lay.units_per_expert == 3
    assert lay.item_bytes().tolist() == [16, 16, 8, 16, 16, 8]  # last cluster of an expert: 2 neurons
    assert lay.items_for(0, 1, [0, 5, 9]).tolist() == [3, 4, 5]


def test_trace_block_matches_the_trace_rows(trace):
    lay = CacheLayout.from_meta(trace.meta)
    chunk = next(trace.chunks())
    block = lay.block(chunk)
    t, layer, slot = 1, 2, 1
    r = chunk.row(t, layer, slot)
    expert = int(chunk.experts[t, layer, slot])
    np.testing.assert_array_equal(block.items[block.offsets[r]:block.offsets[r + 1]],
                                  lay.neuron_keys(layer, expert, chunk.active(t, layer, slot)))
    assert block.step_token[r] == t


def test_cluster_block_weights_count_neurons(trace):
    lay = CacheLayout.from_meta(trace.meta, granularity="cluster", cluster_neurons=8)
    neuron = CacheLayout.from_meta(trace.meta)
    for chunk in trace.chunks():
        b, nb = lay.block(chunk), neuron.block(chunk)
        assert b.weights is not None and b.weights.sum() == nb.items.size
        # every step's cluster items are unique and are the clusters of its neurons
        for s in range(b.n_steps):
            got = b.items[b.offsets[s]:b.offsets[s + 1]]
            neurons = nb.items[nb.offsets[s]:nb.offsets[s + 1]]
            assert got.tolist() == sorted(set((neurons // 64 * lay.units_per_expert + (neurons % 64) // 8).tolist()))


def test_streamed_replay_equals_materialised_replay(trace):
    lay = CacheLayout.from_meta(trace.meta)
    space, block = trace_stream(trace, lay)
    cap = space.total_bytes // 5
    for policy in ("lru", "s3fifo", "static-hot", "window"):
        streamed = replay_trace(trace, policy, cap)
        whole = replay(space, block, policy, cap)
        assert streamed.per_token.equals(whole.per_token), policy
        assert streamed.hits + streamed.misses == streamed.requests == block.n_requests


def test_per_token_counts_add_up(trace):
    res = replay_trace(trace, "belady", 300, neuron_bytes=3)
    pt = res.per_token
    assert len(pt) == trace.meta.n_tokens
    assert (pt["hits"] + pt["misses"] == pt["requests"]).all()
    assert (pt["loaded_bytes"] == 3 * pt["misses"]).all()
    assert res.flash_bytes_per_token == pytest.approx(pt["loaded_bytes"].mean())


def test_per_layer_split_is_one_cache_per_layer(trace):
    """Replaying with split='per-layer' equals running each layer's steps through its
    own policy with an equal share of the capacity."""
    cap = 3 * 90
    res = replay_trace(trace, "lru", cap, split="per-layer")
    lay = CacheLayout.from_meta(trace.meta)
    _, block = trace_stream(trace, lay)
    ipl = lay.n_items // lay.n_layers
    layer_of_step = (np.arange(block.n_steps) // trace.meta.top_k) % trace.meta.n_layers
    hits = 0
    for layer in range(trace.meta.n_layers):
        sel = np.flatnonzero(layer_of_step == layer)
        keys = [block.items[block.offsets[s]:block.offsets[s + 1]] - layer * ipl for s in sel]
        policy = make_policy("lru", cap // 3, ipl)
        hits += sum(policy.step(k).hits for k in keys)
    assert res.hits == hits


def test_cluster_granularity_charges_whole_clusters(trace):
    res = replay_trace(trace, "lru", 10**9, granularity="cluster", cluster_neurons=8, neuron_bytes=2)
    lay = CacheLayout.from_meta(trace.meta, granularity="cluster", cluster_neurons=8, neuron_bytes=2)
    _, block = trace_stream(trace, lay)
    # infinite cache: every cluster is read exactly once, whole
    assert res.loaded_bytes == 2 * 8 * np.unique(block.items).size
    assert res.requests == block.weights.sum()


def test_neuron_cache_steps_equal_the_replay(trace):
    for policy, split in (("lru", "shared"), ("sieve", "per-layer"), ("belady", "per-layer"),
                          ("pi2-segmented", "shared")):
        cache = StepwiseCache.for_trace(trace, policy, 600, split=split)
        hits = misses = loaded = 0
        for chunk in trace.chunks():
            for t in range(chunk.start, chunk.start + chunk.n_tokens):
                for layer in range(trace.meta.n_layers):
                    for slot in range(trace.meta.top_k):
                        expert = int(chunk.experts[t - chunk.start, layer, slot])
                        out = cache.step(layer, expert, chunk.active(t, layer, slot), token=t)
                        hits, misses, loaded = hits + out.hits, misses + out.misses, loaded + out.loaded_bytes
        assert cache.used_bytes <= 600
        res = replay_trace(trace, policy, 600, split=split)
        assert (hits, misses, loaded) == (res.hits, res.misses, res.loaded_bytes), policy


def test_neuron_cache_cluster_granularity_reports_per_neuron_hits(trace):
    cache = StepwiseCache.for_trace(trace, "lru", 10**6, granularity="cluster", cluster_neurons=8)
    first = cache.step(0, 1, np.array([0, 1, 9]))
    assert first.hit.tolist() == [False, False, False] and first.loaded_bytes == 16
    again = cache.step(0, 1, np.array([2, 10, 20]))
    assert again.hit.tolist() == [True, True, False]


def test_neuron_cache_rejects_bad_steps(trace):
    cache = StepwiseCache.for_trace(trace, "lru", 100)
    with pytest.raises(SimError, match="layer"):
        cache.step(99, 0, [1])
    with pytest.raises(SimError, match="neuron ids"):
        cache.step(0, 0, [10**6])
    with pytest.raises(SimError, match="granularity"):
        StepwiseCache.for_trace(trace, "pi2-segmented", 100, granularity="cluster")


def test_requests_csv_round_trip(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("step,key,size\n0,100,4\n0,7,2\n1,100,4\n3,-5,1\n3,7,2\n")
    space, block = read_requests_csv(path)
    assert space.labels.tolist() == [-5, 7, 100]
    assert space.item_bytes.tolist() == [1, 2, 4] and space.total_bytes == 7
    assert block.offsets.tolist() == [0, 2, 3, 5]
    assert space.labels[block.items].tolist() == [100, 7, 100, -5, 7]
    res = replay(space, block, "lru", 6)
    assert (res.hits, res.misses) == (2, 3)


@pytest.mark.parametrize(("text", "message"), [
    ("step,key\n0,1\n0,1\n", "appears twice in step 0"),
    ("step,key,size\n0,1,2\n1,1,3\n", "a key must keep one size"),
    ("step,item\n0,1\n", "missing column"),
    ("step,key\n0,x\n", "row 1"),
    ("step,key,size\n0,1,0\n", r"must be an integer in \[1, 2\*\*40\], got 0"),
    ("step,key,extra\n0,1,2\n", "unknown column"),
])
def test_requests_csv_errors_are_one_line(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SimError, match=message) as err:
        read_requests_csv(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_empty_block_concat_and_arrays():
    empty = RequestBlock.concat([])
    assert empty.n_steps == 0
    space, block = requests_from_arrays(np.array([2, 1]), np.array([5, 6]))
    assert block.step_token.tolist() == [0, 1] and space.labels[block.items].tolist() == [6, 5]


def test_misspelt_options_are_errors(trace):
    with pytest.raises(SimError, match="window_token"):
        replay_trace(trace, "window", 100, window_token=3)
    with pytest.raises(SimError, match="does not take"):
        StepwiseCache.for_trace(trace, "lru", 100, hot_fraction=0.3)
    assert replay_trace(trace, "window", 100, window_tokens=3).requests > 0
