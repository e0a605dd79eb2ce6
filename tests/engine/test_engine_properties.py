"""Invariants of the discrete-event engine, checked with hypothesis on tiny models.

- more memory, faster storage or more cores never lowers decode tokens/s;
- simulated time is never below the physical bounds: bytes read from flash over the
  storage's peak throughput, and weight bytes streamed from DRAM over its peak bandwidth;
- the same seed gives identical per-token rows and summary (``wall_s`` aside), also in
  another interpreter with another string-hash seed;
- per token, cache hits + misses = requests.

Each example is a couple of ~10 ms simulations of a 2-3 layer model (engine_helpers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import engine_helpers as h
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.simulation import SimResult, simulate
from sim.profiles.memory import plan_memory

# ENGINE_EXAMPLES=200 explores more (the suite keeps a small count to stay fast).
EXAMPLES = int(os.environ.get("ENGINE_EXAMPLES", "30"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODELS = st.sampled_from([h.TINY_MOE, h.TINY_DENSE])
DECODE = 6
PROMPT = 8
WARMUP = 4


def run(device, raw, *, seed: int = 0, strategy: str = "powerinfer2", **kw) -> SimResult:
    m = h.model(raw)
    result = simulate(device, m, strategy, trace=h.trace(m, WARMUP + DECODE, seed), decode_tokens=DECODE,
                      prompt_tokens=PROMPT, warmup_tokens=WARMUP, seed=seed, **kw)
    check_counts(result)
    return result


def check_counts(result: SimResult) -> None:
    """hits + misses = requests for every token, and none is negative."""
    t = result.tokens
    assert (t["hits"] + t["misses"] == t["requests"]).all()
    assert (t[["hits", "misses", "requests", "flash_bytes"]] >= 0).all().all()


def tps(result: SimResult) -> float:
    return result.summary["decode_tokens_per_s"]


def budget_bytes(raw, device, resident_fraction: float) -> int:
    """A memory budget keeping ``resident_fraction`` of the FFN in DRAM."""
    return plan_memory(h.model(raw), device, offload=1.0 - resident_fraction).budget_bytes


# Ties in the DES (equal finish times) are broken identically in both runs; allow only
# float rounding, not a real slowdown.
REL = 1e-9


# Only stack policies: a bigger LRU cache holds everything a smaller one would, so no
# request misses that the smaller cache hits. FIFO-family policies (S3-FIFO, FIFO, CLOCK)
# lack that inclusion property and show Belady's anomaly: hypothesis found tiny-dense, seed 2,
# s3fifo, 0% -> 3.5% of FFN resident, where the last token misses once more with the bigger
# cache and decode is 0.2% slower. That is the policy's behaviour, not the engine's (a test in
# tests/engine/test_policy_anomaly.py pins it).
@SETTINGS
@given(raw=MODELS, fractions=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2, unique=True),
       seed=st.integers(0, 3), policy=st.sampled_from([None, "lru"]))
def test_tokens_per_s_never_drops_when_memory_budget_grows(raw, fractions, seed, policy):
    dev = h.device()
    small, large = sorted(fractions)
    slow = run(dev, raw, seed=seed, memory_budget=budget_bytes(raw, dev, small), policy=policy)
    fast = run(dev, raw, seed=seed, memory_budget=budget_bytes(raw, dev, large), policy=policy)
    assert fast.summary["memory"]["neuron_cache"] >= slow.summary["memory"]["neuron_cache"]
    assert tps(fast) >= tps(slow) * (1 - REL)


@SETTINGS
@given(raw=MODELS, factors=st.lists(st.floats(0.25, 4.0), min_size=2, max_size=2, unique=True),
       offload=st.floats(0.2, 1.0), seed=st.integers(0, 3), gate=st.booleans())
def test_tokens_per_s_never_drops_when_storage_bandwidth_grows(raw, factors, offload, seed, gate):
    low, high = sorted(factors)
    knobs = {"split_gate_read": gate}
    slow = run(h.scaled_storage(low), raw, seed=seed, offload=offload, knobs=knobs)
    fast = run(h.scaled_storage(high), raw, seed=seed, offload=offload, knobs=knobs)
    assert tps(fast) >= tps(slow) * (1 - REL)


@SETTINGS
@given(raw=MODELS, cluster=st.sampled_from(["big", "mid-hi", "mid"]), extra=st.integers(1, 3),
       offload=st.floats(0.0, 0.9), seed=st.integers(0, 3), strategy=st.sampled_from(["powerinfer2", "dense"]))
def test_tokens_per_s_never_drops_when_cores_are_added(raw, cluster, extra, offload, seed, strategy):
    base = {c["name"]: c["cores"] for c in h.device_data()["cpu"]["clusters"]}[cluster]
    kw = {"offload": offload} if strategy == "powerinfer2" else {}
    slow = run(h.with_cores(cluster, base), raw, seed=seed, strategy=strategy, **kw)
    fast = run(h.with_cores(cluster, base + extra), raw, seed=seed, strategy=strategy, **kw)
    assert tps(fast) >= tps(slow) * (1 - REL)


def storage_variant(queues: int, penalty: float):
    data = h.device_data()
    data["storage"]["command_queues"] = queues
    data["storage"]["multi_issuer_penalty"] = penalty
    return h.device(data)


@SETTINGS
@given(raw=MODELS, offload=st.floats(0.0, 1.0), dtype=st.sampled_from(["int4", "int8", "fp16"]),
       storage=st.floats(0.25, 4.0), queues=st.sampled_from([1, 4]), io=st.integers(1, 3),
       npu=st.sampled_from([0.0, 0.5]), seed=st.integers(0, 3))
def test_simulated_time_respects_physical_bounds(raw, offload, dtype, storage, queues, io, npu, seed):
    data = h.device_data()
    data["storage"]["command_queues"] = queues
    dev = h.scaled_storage(storage, data)
    knobs = {"io_cores": ["mid-hi"] * io, "compute_cores": ["big", "mid", "mid"], "npu_activation_share": npu}
    result = run(dev, raw, seed=seed, offload=offload, weights_dtype=dtype, knobs=knobs)
    usage = result.usage
    assert usage is not None
    total_s = result.summary["ttft_s"] + result.tokens["latency_s"].sum()
    storage_peak = max(p.gbps for p in dev.storage.seq_read + dev.storage.rand_read) * 1e9
    assert total_s >= usage.flash_bytes / storage_peak
    assert (result.tokens["latency_s"] >= result.tokens["flash_bytes"] / storage_peak).all()
    assert usage.dram_bytes > 0
    assert total_s >= usage.dram_bytes / (dev.dram.peak_gbps * 1e9)
    assert usage.flash_bytes >= result.tokens["flash_bytes"].sum()


@settings(max_examples=6, deadline=None)
@given(raw=MODELS, seed=st.integers(0, 3), offload=st.floats(0.0, 1.0),
       strategy=st.sampled_from(["powerinfer2", "dense"]), mode=st.sampled_from(["des", "analytic"]))
def test_same_seed_gives_identical_results(raw, seed, offload, strategy, mode):
    kw = {"offload": offload} if strategy == "powerinfer2" else {}
    timeline = mode == "des"  # the cost model has no timeline (simulate refuses to pretend)
    a = run(h.device(), raw, seed=seed, strategy=strategy, mode=mode, timeline=timeline, **kw)
    b = run(h.device(), raw, seed=seed, strategy=strategy, mode=mode, timeline=timeline, **kw)
    pd.testing.assert_frame_equal(a.tokens, b.tokens, check_exact=True)
    assert h.summary_without_wall(a.summary) == h.summary_without_wall(b.summary)
    assert a.spans == b.spans


def test_same_seed_identical_across_interpreters(tmp_path):
    """Summaries must not depend on set/dict iteration order (string hashing differs per process)."""
    model = h.write_yaml(tmp_path / "tiny.yaml", h.TINY_MOE)
    trace_path = h.trace(h.model(), 12).save(tmp_path / "tiny.npz")
    argv = [sys.executable, "-m", "sim", "run", "--model", str(model), "--trace", str(trace_path), "--offload", "0.6",
            "--decode-tokens", "8", "--warmup-tokens", "4", "--prompt-tokens", "8", "--json"]
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        summary = json.loads(proc.stdout)
        summary.pop("wall_s")
        outs.append(summary)
    assert outs[0] == outs[1]


def test_seed_changes_the_synthetic_run():
    """The seed reaches the trace: different seeds give different per-token rows."""
    a = run(h.device(), h.TINY_MOE, seed=0, offload=0.7)
    b = run(h.device(), h.TINY_MOE, seed=1, offload=0.7)
    assert not np.array_equal(a.tokens["misses"].to_numpy(), b.tokens["misses"].to_numpy())


@pytest.mark.parametrize("strategy", ["powerinfer2", "dense"])
def test_requests_cover_the_active_set(strategy):
    """Every predicted neuron of every chosen expert is one request (dense: every neuron)."""
    m = h.model()
    tr = h.trace(m, WARMUP + DECODE)
    result = run(h.device(), h.TINY_MOE, strategy=strategy, **({"offload": 0.5} if strategy == "powerinfer2" else {}))
    if strategy == "dense":
        assert (result.tokens["requests"] == m.n_layers * m.top_k * m.ffn_dim).all()
        assert (result.tokens["misses"] == 0).all()
        return
    chunks = list(tr.chunks())
    predicted = np.concatenate([np.diff(c.pred_offsets).reshape(c.n_tokens, -1).sum(axis=1) for c in chunks])
    np.testing.assert_array_equal(result.tokens["requests"].to_numpy(), predicted[WARMUP:WARMUP + DECODE])
