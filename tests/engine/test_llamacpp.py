"""llama.cpp with mmap: the page cache (LRU over read-ahead chunks) and synchronous faults.

A tiny dense model and a tiny MoE model are written to YAML files; traces are hand-made.
The device is the bundled OnePlus 12; assertions compare runs, not fixed numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.simulation import simulate
from sim.errors import SimError
from sim.hw.flash import FlashModel
from sim.profiles.memory import model_weight_bytes
from sim.profiles.registry import load_device, load_model
from sim.traces.format import Trace, TraceMeta

BASE = {
    "family": "mistral", "n_layers": 2, "hidden": 1024, "ffn_dim": 4096, "n_heads": 8, "n_kv_heads": 8,
    "vocab": 2048, "max_context": 512, "ffn_gated": True, "activation": "relu", "tied_embeddings": False,
    "sparsity": {"mean_active_fraction": 0.1, "source": "test"},
    "predictor": {"rank": 16, "dtype": "fp16", "per_expert": True, "source": "test"},
    "default_dtype": "int4", "published_params_b": 0.05, "source": "test",
}
PHASES = ("io_s", "attention_s", "ffn_s", "lm_head_s")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("models")
    out = {}
    for name, extra in (("tiny-dense", {}), ("tiny-moe", {"moe": {"n_experts": 4, "top_k": 1}})):
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**BASE, "name": name, **extra}))
        out[name] = str(path)
    return out


def trace_for(model: str, n_tokens: int, experts: np.ndarray | None = None, seed: int = 0) -> Trace:
    m = load_model(model)
    rng = np.random.default_rng(seed)
    rows = [np.sort(rng.choice(m.ffn_dim, 100, replace=False)).astype(np.int32)
            for _ in range(n_tokens * m.n_layers * m.top_k)]
    meta = TraceMeta(model=m.name, n_layers=m.n_layers, n_neurons=m.ffn_dim, hidden=m.hidden,
                     n_experts=m.n_experts, top_k=m.top_k, source="synthetic")
    if experts is not None:
        experts = np.broadcast_to(experts.reshape(n_tokens, 1, 1), (n_tokens, m.n_layers, m.top_k)).astype(np.int16)
    return Trace.from_rows(meta, rows, experts=experts)


def run(model: str, trace: Trace, knobs: dict | None = None, **kw):
    opts = {"device": "oneplus-12", "strategy": "llamacpp", "prompt_tokens": 8, "decode_tokens": 10,
            "warmup_tokens": 4}
    opts.update(kw)
    return simulate(opts.pop("device"), model, opts.pop("strategy"), trace=trace, knobs=knobs or {}, **opts)


def phase(result, name: str) -> np.ndarray:
    df = result.tokens
    return df[name].to_numpy() if name in df else np.zeros(len(df))


def test_a_budget_that_holds_the_model_faults_nothing_after_warmup(models):
    model = models["tiny-dense"]
    trace = trace_for(model, 14)
    big = run(model, trace)  # the device's usable DRAM: far more than the model
    assert big.tokens["misses"].sum() == 0
    assert big.summary["flash_bytes_per_token"] == 0
    assert phase(big, "io_s").sum() == 0
    small = run(model, trace, offload=0.5)
    assert small.tokens["misses"].min() > 0
    assert phase(small, "io_s").min() > 0
    assert small.summary["decode_tokens_per_s"] < big.summary["decode_tokens_per_s"]


def test_in_memory_llamacpp_computes_like_dense(models):
    model = models["tiny-dense"]
    trace = trace_for(model, 14)
    mmap = run(model, trace)
    dense = run(model, trace, strategy="dense")
    np.testing.assert_allclose(mmap.tokens["latency_s"], dense.tokens["latency_s"], rtol=1e-9)


def test_lru_thrashes_on_a_layer_cycle_larger_than_the_cache(models):
    """A token sweeps the file in order; LRU over a cyclic sweep bigger than the cache
    misses on (nearly) every chunk, which is why llama.cpp collapses when offloading."""
    model = models["tiny-dense"]
    result = run(model, trace_for(model, 14), offload=0.5, policy="lru")
    ratio = result.tokens["misses"] / result.tokens["requests"]
    assert ratio.min() > 0.9
    # ... and the summary says so, since the memory table still gives the cache half the FFN
    assert any("evicts each item before its reuse" in w for w in result.summary["warnings"])
    # the default page cache (Linux's two lists with refault detection) keeps part of the cycle, and the
    # warning goes away with the thrashing
    kept = run(model, trace_for(model, 14), offload=0.5)
    assert kept.summary["cache_hit_ratio"] > 0.2
    assert not any("evicts each item" in w for w in kept.summary["warnings"])


def test_faults_are_synchronous(models):
    model = models["tiny-dense"]
    result = run(model, trace_for(model, 14), offload=0.5)
    lat = result.tokens["latency_s"].to_numpy()
    io = phase(result, "io_s")
    parts = sum(phase(result, p) for p in PHASES)
    np.testing.assert_allclose(lat, parts, rtol=1e-9)
    assert (lat >= np.maximum(io, parts - io)).all()
    ana = run(model, trace_for(model, 14), offload=0.5, mode="analytic")
    np.testing.assert_allclose(ana.tokens["latency_s"], lat, rtol=1e-9)


def test_fault_bytes_are_whole_readahead_chunks(models):
    model = models["tiny-dense"]
    trace = trace_for(model, 14)
    for readahead in (32 * 1024, 128 * 1024):
        result = run(model, trace, {"readahead_bytes": readahead}, offload=0.5)
        df = result.tokens
        np.testing.assert_array_equal(df["flash_bytes"], df["misses"] * readahead)
    small = run(model, trace, {"readahead_bytes": 16 * 1024}, offload=0.5)
    large = run(model, trace, {"readahead_bytes": 256 * 1024}, offload=0.5)
    assert small.tokens["requests"].mean() > 8 * large.tokens["requests"].mean()


def test_only_the_chosen_experts_are_touched(models):
    model = models["tiny-moe"]
    m = load_model(model)
    n = 14
    # a budget that holds attention, one expert per layer and the head, not all experts
    weights = model_weight_bytes(m, "int4")
    budget = int(weights * 0.6) + 301_000_000  # + the runtime (0.3 GB) and a tiny KV cache
    same = run(model, trace_for(model, n, experts=np.zeros(n, dtype=np.int16)), memory_budget=budget)
    cycling = run(model, trace_for(model, n, experts=np.arange(n, dtype=np.int16) % 4), memory_budget=budget)
    # prefill swept every expert through the cache; after the first token it settles
    assert same.tokens["misses"].iloc[1:].sum() == 0
    assert cycling.tokens["misses"].iloc[1:].min() > 0
    # requests per token: attention + one expert per layer, never the whole layer
    whole = run(model, trace_for(model, n, experts=np.zeros(n, dtype=np.int16)))
    per_token = whole.tokens["requests"].iloc[0]
    file_chunks = weights / (128 * 1024)
    assert per_token < 0.6 * file_chunks


def test_bad_knobs_are_one_line_errors(models):
    model = models["tiny-dense"]
    with pytest.raises(SimError):
        run(model, trace_for(model, 14), {"readahead_bytes": 100})
    with pytest.raises(SimError):
        run(model, trace_for(model, 14), {"window_k": 5})


@settings(max_examples=10, deadline=None)
@given(share=st.floats(0.3, 1.2), readahead_kib=st.sampled_from([16, 64, 128, 512]))
def test_invariants(models, share, readahead_kib):
    model = models["tiny-dense"]
    m = load_model(model)
    budget = int(model_weight_bytes(m, "int4") * share) + 400_000_000  # + runtime and KV cache
    result = run(model, trace_for(model, 12), {"readahead_bytes": readahead_kib * 1024}, memory_budget=budget,
                 decode_tokens=8)
    df = result.tokens
    assert (df["hits"] + df["misses"] == df["requests"]).all()
    peak = FlashModel(load_device("oneplus-12")).peak_gbps * 1e9
    assert (df["latency_s"] >= df["flash_bytes"] / peak).all()
    np.testing.assert_allclose(df["latency_s"], sum(phase(result, p) for p in PHASES), rtol=1e-9)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=12), chunk=st.integers(1, 700),
       pick=st.data())
def test_the_union_of_file_ranges_is_numpys_unique(sizes, chunk, pick):
    """Chunk ranges laid out one after another (as FileLayout lays out a layer's attention and
    experts), any ascending selection of them: the one-pass union is np.unique's."""
    from sim.engine.strategies.llamacpp import _sorted_union

    offset, ranges = 0, []
    for size in sizes:
        start, offset = offset, offset + size
        ranges.append(np.arange(start // chunk, (offset - 1) // chunk + 1, dtype=np.int64))
    chosen = sorted(pick.draw(st.sets(st.integers(0, len(ranges) - 1), min_size=1)))
    parts = [ranges[i] for i in chosen]
    assert np.array_equal(_sorted_union(parts), np.unique(np.concatenate(parts)))


@pytest.mark.parametrize("model_name", ["tiny-dense", "tiny-moe"])
def test_a_tokens_faults_in_one_call_are_the_chunk_by_chunk_faults(models, model_name):
    """A token's chunks served in one page-cache call fault exactly where serving each
    layer's attention, then its experts, then the LM head one call at a time does, layer by
    layer (the split the steps charge), through evictions of a cache smaller than a token."""
    import simpy

    from sim.engine.machine import Machine
    from sim.engine.simulation import check_options, make_strategy, profile_counts, run_trace
    from sim.engine.strategies.base import TokenStats
    from sim.engine.workload import iter_token_layers

    model = models[model_name]
    m = load_model(model)
    n = 12
    trace = trace_for(model, n, experts=np.arange(n, dtype=np.int16) % 4 if m.n_experts > 1 else None)
    setup = check_options("oneplus-12", model, "llamacpp", trace=trace, prompt_tokens=8, decode_tokens=n - 4,
                          warmup_tokens=4, memory_budget=int(model_weight_bytes(m, "int4") * 0.4) + 301_000_000)
    tr, profile_tokens, _ = run_trace(setup)
    pop = profile_counts(setup, tr, profile_tokens)
    whole, piecewise = (make_strategy(setup, tr.meta, pop, Machine(simpy.Environment(), setup.device,
                                                                   setup.compute_cores, setup.io_cores))
                        for _ in range(2))
    lay, last, faulted = piecewise.layout, m.n_layers - 1, 0
    for t, layers in iter_token_layers(tr, 0, n):
        attn, ffn, head = whole._token_faults(t, layers, TokenStats())
        stats = TokenStats()
        for i, work in enumerate(layers):
            assert attn[i] == piecewise._serve([lay.attention[work.layer]], t, stats)[0]
            assert ffn[i] == piecewise._serve([lay.layer_experts(work.layer, work.experts)], t, stats)[0]
            if work.layer == last:
                assert head == piecewise._serve([lay.lm_head], t, stats)[0]
        faulted += sum(attn) + sum(ffn) + head
    assert faulted > 0  # the cache is smaller than the file: the comparison saw faults
