"""LLM in a Flash strategy: window, bundling, load-then-compute, memory management, ladder.

Runs a tiny OPT-like model (2 layers, written to a YAML file) on hand-made traces so the
tests depend on no bundled model profile or trace preset; the device is the bundled
OnePlus 12 and every assertion compares runs with each other, not with fixed numbers.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import simpy
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.machine import Machine
from sim.engine.simulation import simulate
from sim.engine.strategies import llm_in_flash as lif
from sim.errors import SimError
from sim.hw.flash import FlashModel
from sim.profiles.registry import load_device
from sim.traces.format import Trace, TraceMeta

TINY_OPT = {
    "name": "tiny-opt", "family": "opt", "n_layers": 2, "hidden": 2048, "ffn_dim": 8192, "n_heads": 16,
    "n_kv_heads": 16, "vocab": 4096, "max_context": 512, "ffn_gated": False, "activation": "relu",
    "tied_embeddings": True, "sparsity": {"mean_active_fraction": 0.05, "source": "test"},
    "predictor": {"rank": 16, "dtype": "fp16", "per_expert": True, "source": "test"},
    "default_dtype": "fp16", "published_params_b": 0.11, "source": "test",
}
PHASES = ("attention_s", "predictor_s", "io_s", "memory_management_s", "ffn_s", "lm_head_s")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "tiny-opt.yaml"
    path.write_text(yaml.safe_dump(TINY_OPT))
    return str(path)


def locality_trace(n_tokens: int, active: int, churn: float, seed: int = 0, fp: int = 0,
                   n_layers: int = 2, n_neurons: int = 8192) -> Trace:
    """Each layer's active set keeps all but ``churn`` of its neurons from one token to the
    next (temporal locality); predicted = active plus ``fp`` false positives."""
    rng = np.random.default_rng(seed)
    cur = [rng.choice(n_neurons, active, replace=False) for _ in range(n_layers)]
    rows, preds = [], []
    for t in range(n_tokens):
        for layer in range(n_layers):
            if t and churn:
                k = int(round(churn * active))
                keep = rng.choice(active, active - k, replace=False)
                fresh = rng.choice(np.setdiff1d(np.arange(n_neurons), cur[layer]), k, replace=False)
                cur[layer] = np.concatenate([cur[layer][keep], fresh])
            act = np.sort(cur[layer]).astype(np.int32)
            extra = rng.choice(np.setdiff1d(np.arange(n_neurons), act), fp, replace=False) if fp else []
            rows.append(act)
            preds.append(np.union1d(act, extra).astype(np.int32))
    meta = TraceMeta(model="tiny-opt", n_layers=n_layers, n_neurons=n_neurons, hidden=2048, source="synthetic")
    return Trace.from_rows(meta, rows, predicted=preds)


def run(model: str, trace: Trace, knobs: dict | None = None, **kw):
    opts = {"device": "oneplus-12", "strategy": "llm-in-flash", "offload": 0.5, "prompt_tokens": 8,
            "decode_tokens": 12, "warmup_tokens": 6}
    opts.update(kw)
    return simulate(opts.pop("device"), model, opts.pop("strategy"), trace=trace, knobs=knobs or {}, **opts)


def phase(result, name: str) -> np.ndarray:
    df = result.tokens
    return df[name].to_numpy() if name in df else np.zeros(len(df))


# -- parallel issue on the flash model -------------------------------------------------------
def test_one_blocking_reader_is_latency_bound_and_32_are_not():
    dev = load_device("oneplus-12")
    flash = FlashModel(dev)
    big = dev.cpu.cluster("big")
    block = 8192
    one = flash.parallel_throughput_gbps(block, [big], blocking=True)
    device = flash.device_gbps(block)
    assert one == pytest.approx(block / (flash.latency_s + block / (device * 1e9)) / 1e9)
    many = flash.parallel_throughput_gbps(block, [big] * 32, blocking=True)
    assert many > 3 * one  # 32 requests in flight hide the latency (one core issues them)
    assert many <= device


def test_threads_beyond_a_clusters_cores_add_no_issuers_and_ufs_penalises_several():
    dev = load_device("oneplus-12")
    flash = FlashModel(dev)
    mid = dev.cpu.cluster("mid-hi")
    assert flash.issuing_cores([mid] * 10) == mid.cores
    one_core = flash.parallel_throughput_gbps(512 * 1024, [dev.cpu.cluster("big")], blocking=False)
    three = flash.parallel_throughput_gbps(512 * 1024, [mid] * 3, blocking=False)
    # [PI2 §2.3]: issuing from several cores of one UFS queue loses throughput, never gains.
    assert three < one_core
    assert three == pytest.approx(flash.device_gbps(512 * 1024) * (1 - dev.storage.multi_issuer_penalty * 2 / 3))


def test_parallel_read_is_one_storage_event_and_charges_each_core_once():
    dev = load_device("macbook-pro-m1-max") if _has_device("macbook-pro-m1-max") else load_device("oneplus-12")
    env = simpy.Environment()
    cluster = dev.cpu.clusters[0]
    m = Machine(env, dev, [cluster.name], [cluster.name] * 32)
    env.process(m.read("r", 1000, 16384, issuers=32, blocking=True))
    env.run()
    cores = [cluster] * 32
    expect = m.flash.parallel_batch_time_s(1000, 16384, cores, blocking=True)
    assert env.now == pytest.approx(expect)
    io_busy = sum(v for k, v in m.usage.busy_s.items() if k.startswith("io"))
    assert io_busy == pytest.approx(expect * min(32, cluster.cores))
    assert m.usage.flash_requests == 1000


def _has_device(name: str) -> bool:
    try:
        load_device(name)
    except SimError:
        return False
    return True


# -- the strategy --------------------------------------------------------------------------
def test_window_k0_loads_more_than_k5(tiny):
    trace = locality_trace(20, active=400, churn=0.2, fp=200)
    k5 = run(tiny, trace, {"window_k": 5})
    k0 = run(tiny, trace, {"window_k": 0})
    assert k0.summary["flash_bytes_per_token"] > 2 * k5.summary["flash_bytes_per_token"]
    assert k5.summary["cache_hit_ratio"] > 0.5
    assert k0.summary["cache_hit_ratio"] == 0.0
    assert phase(k0, "io_s").mean() > phase(k5, "io_s").mean()


def test_a_pinned_share_holds_the_profiles_hottest_neurons_past_the_window(tiny):
    """A hot set firing every other token misses each time under a one-token window; with a
    hot region of the profile's most active neurons it always hits, and fewer bytes are read."""
    rng = np.random.default_rng(1)
    hot = [rng.choice(8192, 200, replace=False) for _ in range(2)]
    rows = []
    for t in range(20):
        for layer in range(2):
            cold = rng.choice(np.setdiff1d(np.arange(8192), hot[layer]), 100, replace=False)
            rows.append(np.sort(np.concatenate([cold, hot[layer]] if t % 2 else [cold])).astype(np.int32))
    meta = TraceMeta(model="tiny-opt", n_layers=2, n_neurons=8192, hidden=2048, source="synthetic")
    trace = Trace.from_rows(meta, rows, predicted=rows)
    window = run(tiny, trace, {"window_k": 1})
    pinned = run(tiny, trace, {"window_k": 1, "pinned_share": 0.5})
    odd = pinned.tokens[pinned.tokens["token"] % 2 == 1]
    assert (odd["hits"] >= 2 * 200).all()  # both layers' hot sets, every time they fire
    assert pinned.summary["cache_hit_ratio"] > window.summary["cache_hit_ratio"]
    assert pinned.summary["flash_bytes_per_token"] < window.summary["flash_bytes_per_token"]


def test_bundling_halves_the_number_of_reads(tiny, monkeypatch):
    calls: list[tuple[str, int, int]] = []
    original = lif.read  # the read steps the strategy asks the machine for

    def spy(phase, name, n_requests, block_bytes, **kw):
        calls.append((name, n_requests, block_bytes))
        return original(phase, name, n_requests, block_bytes, **kw)

    monkeypatch.setattr(lif, "read", spy)
    trace = locality_trace(20, active=400, churn=0.3, fp=100)
    counts = {}
    for bundling in (True, False):
        calls.clear()
        result = run(tiny, trace, {"bundling": bundling})
        counts[bundling] = sum(n for name, n, _ in calls if name == "neuron-read")
        blocks = {b for name, _, b in calls if name == "neuron-read"}
        assert len(blocks) == 1
        if bundling:
            assert result.summary["flash_bytes_per_token"] > 0
    assert counts[True] > 0
    assert counts[False] == 2 * counts[True]  # OPT-like FFN: up column and down row, read apart


def test_load_then_compute_latency_is_the_sum_of_its_steps(tiny):
    trace = locality_trace(20, active=400, churn=0.3, fp=100)
    result = run(tiny, trace)
    lat = result.tokens["latency_s"].to_numpy()
    parts = sum(phase(result, p) for p in PHASES)
    io = phase(result, "io_s")
    compute = parts - io
    assert (io > 0).all() and (compute > 0).all()
    np.testing.assert_allclose(lat, parts, rtol=1e-9)  # no I/O-compute overlap
    assert (lat >= np.maximum(io, compute)).all()


def test_des_matches_the_analytic_sum(tiny):
    trace = locality_trace(20, active=400, churn=0.3, fp=100)
    des = run(tiny, trace)
    ana = run(tiny, trace, mode="analytic")
    np.testing.assert_allclose(des.tokens["latency_s"], ana.tokens["latency_s"], rtol=1e-9)
    np.testing.assert_array_equal(des.tokens["flash_bytes"], ana.tokens["flash_bytes"])


def test_io_ladder_falls_as_each_mechanism_is_switched_on(tiny):
    """[FLASH Table 2]'s order: naive > hybrid > +predictor > +window > +bundling."""
    trace = locality_trace(20, active=400, churn=0.2, fp=300)
    ladder = [
        {"hybrid": False, "predictor": False, "window_k": 0, "bundling": False},
        {"predictor": False, "window_k": 0, "bundling": False},
        {"window_k": 0, "bundling": False},
        {"bundling": False},
        {},
    ]
    io = [phase(run(tiny, trace, knobs), "io_s").mean() for knobs in ladder]
    assert all(a > b for a, b in itertools.pairwise(io)), io


def test_naive_reads_every_weight_every_token(tiny):
    trace = locality_trace(20, active=400, churn=0.2)
    result = run(tiny, trace, {"hybrid": False, "predictor": False, "window_k": 0, "bundling": False})
    m = TINY_OPT
    weights = (4 * m["hidden"] ** 2 + 2 * m["hidden"] * m["ffn_dim"]) * m["n_layers"] + m["vocab"] * m["hidden"]
    assert result.summary["flash_bytes_per_token"] >= 2 * weights  # fp16
    assert result.summary["cache_hit_ratio"] == 0.0
    assert "predictor" not in result.summary["phases_ms_per_token"]


def test_memory_management_follows_churn(tiny):
    still = locality_trace(20, active=400, churn=0.0)
    moving = locality_trace(20, active=400, churn=0.3)
    calm = run(tiny, still)
    busy = run(tiny, moving)
    # a fixed active set stays in the window: nothing read, no rows copied
    assert calm.summary["flash_bytes_per_token"] == 0
    assert phase(calm, "memory_management_s").sum() == 0
    assert phase(busy, "memory_management_s").mean() > 0
    dense = run(tiny, moving, {"predictor": False})
    assert phase(dense, "memory_management_s").sum() == 0
    one = run(tiny, moving, {"memcpy_threads": 1})
    assert phase(one, "memory_management_s").mean() > phase(busy, "memory_management_s").mean()


def moves_per_token(monkeypatch, model: str, trace: Trace, knobs: dict, **kw) -> tuple[np.ndarray, object]:
    """A run and the rows its memory management moved (inserted + evicted) in each decode token."""
    moved: dict[int, int] = {}
    plan = lif.LlmInFlash._token_plan

    def spy(self, layers, t, stats):
        out = plan(self, layers, t, stats)
        moved[t] = moved.get(t, 0) + sum(layer[2] for layer in out)
        return out

    monkeypatch.setattr(lif.LlmInFlash, "_token_plan", spy)
    result = run(model, trace, knobs, **kw)
    monkeypatch.undo()
    n = len(result.tokens)
    return np.array([moved[t] for t in sorted(moved)[-n:]], dtype=float), result  # the last n: decode


@pytest.mark.parametrize("mode", ["des", "analytic"])
def test_row_move_overhead_adds_moved_times_overhead_to_memory_management(tiny, monkeypatch, mode):
    trace = locality_trace(20, active=400, churn=0.3, fp=100)
    moved, base = moves_per_token(monkeypatch, tiny, trace, {}, mode=mode)
    again, paid = moves_per_token(monkeypatch, tiny, trace, {"row_move_overhead_us": 2.0}, mode=mode)
    np.testing.assert_array_equal(moved, again)
    assert moved.min() > 0
    extra = phase(paid, "memory_management_s") - phase(base, "memory_management_s")
    np.testing.assert_allclose(extra, moved * 2e-6, rtol=1e-9)
    np.testing.assert_allclose(paid.tokens["latency_s"] - base.tokens["latency_s"], moved * 2e-6, rtol=1e-6)
    for other in ("attention_s", "predictor_s", "io_s", "ffn_s", "lm_head_s"):
        np.testing.assert_allclose(phase(paid, other), phase(base, other), rtol=1e-9)


def test_row_move_overhead_of_zero_is_the_default(tiny):
    trace = locality_trace(20, active=400, churn=0.3, fp=100)
    for mode in ("des", "analytic"):
        default = run(tiny, trace, mode=mode)
        zero = run(tiny, trace, {"row_move_overhead_us": 0.0}, mode=mode)
        pd.testing.assert_frame_equal(default.tokens, zero.tokens, check_exact=True)


def test_row_move_overhead_keeps_des_and_analytic_equal(tiny):
    trace = locality_trace(20, active=400, churn=0.3, fp=100)
    knobs = {"row_move_overhead_us": 3.0}
    des = run(tiny, trace, knobs)
    ana = run(tiny, trace, knobs, mode="analytic")
    np.testing.assert_allclose(des.tokens["latency_s"], ana.tokens["latency_s"], rtol=1e-9)
    np.testing.assert_allclose(phase(des, "memory_management_s"), phase(ana, "memory_management_s"), rtol=1e-9)


@settings(max_examples=10, deadline=None)
@given(low=st.floats(0.0, 50.0), step=st.floats(0.0, 50.0), churn=st.sampled_from([0.0, 0.1, 0.5]),
       mode=st.sampled_from(["des", "analytic"]))
def test_memory_management_never_falls_as_the_row_move_overhead_rises(tiny, low, step, churn, mode):
    trace = locality_trace(14, active=300, churn=churn, fp=50)
    a = run(tiny, trace, {"row_move_overhead_us": low}, decode_tokens=8, mode=mode)
    b = run(tiny, trace, {"row_move_overhead_us": low + step}, decode_tokens=8, mode=mode)
    assert (phase(b, "memory_management_s") >= phase(a, "memory_management_s")).all()
    assert (b.tokens["latency_s"] >= a.tokens["latency_s"] * (1 - 1e-12)).all()


def test_a_budget_holding_the_whole_ffn_reads_nothing(tiny):
    trace = locality_trace(20, active=400, churn=0.3, fp=100)
    inmem = run(tiny, trace, offload=0.0)
    assert inmem.summary["flash_bytes_per_token"] == 0
    assert inmem.summary["cache_hit_ratio"] == 1.0
    assert phase(inmem, "memory_management_s").sum() == 0
    offloaded = run(tiny, trace, offload=0.5)
    assert inmem.summary["decode_tokens_per_s"] > offloaded.summary["decode_tokens_per_s"]


def test_window_matrix_is_computed_whole_by_default(tiny):
    trace = locality_trace(20, active=400, churn=0.3)
    whole = run(tiny, trace)
    predicted = run(tiny, trace, {"compute_rows": "predicted"})
    assert phase(whole, "ffn_s").mean() > phase(predicted, "ffn_s").mean()
    assert phase(whole, "io_s").mean() == pytest.approx(phase(predicted, "io_s").mean())


def test_one_reader_thread_is_slower_than_32(tiny):
    trace = locality_trace(20, active=400, churn=0.3)
    many = run(tiny, trace)
    one = run(tiny, trace, {"io_cores": ["big"]})
    assert phase(one, "io_s").mean() > 2 * phase(many, "io_s").mean()


def test_predictor_cost_is_charged_only_with_the_predictor(tiny):
    trace = locality_trace(20, active=400, churn=0.3)
    with_pred = run(tiny, trace)
    assert phase(with_pred, "predictor_s").min() > 0
    without = run(tiny, trace, {"predictor": False})
    assert "predictor" not in without.summary["phases_ms_per_token"]
    assert with_pred.summary["memory"].get("predictors", 0) > 0  # [FLASH]: the predictor lives in DRAM


@pytest.mark.parametrize("knobs", [{"window_k": -1}, {"io_threads": 4}, {"compute_rows": "all"},
                                   {"row_move_overhead_us": -1.0}, {"pinned_share": 1.0}])
def test_bad_knobs_are_one_line_errors(tiny, knobs):
    with pytest.raises(SimError):
        run(tiny, locality_trace(20, active=40, churn=0.1), knobs)


@settings(max_examples=12, deadline=None)
@given(hybrid=st.booleans(), predictor=st.booleans(), window_k=st.integers(0, 6), bundling=st.booleans(),
       churn=st.sampled_from([0.0, 0.1, 0.5]), offload=st.sampled_from([0.2, 0.5, 0.9]),
       pinned_share=st.sampled_from([0.0, 0.5, 0.9]))
def test_invariants_hold_for_every_configuration(tiny, hybrid, predictor, window_k, bundling, churn, offload,
                                                 pinned_share):
    trace = locality_trace(14, active=300, churn=churn, fp=50)
    knobs = {"hybrid": hybrid, "predictor": predictor, "window_k": window_k, "bundling": bundling,
             "pinned_share": pinned_share}
    result = run(tiny, trace, knobs, offload=offload, decode_tokens=8)
    df = result.tokens
    assert (df["hits"] + df["misses"] == df["requests"]).all()
    # never faster than the storage's peak throughput allows
    peak = FlashModel(load_device("oneplus-12")).peak_gbps * 1e9
    assert (df["latency_s"] >= df["flash_bytes"] / peak).all()
    np.testing.assert_allclose(df["latency_s"], sum(phase(result, p) for p in PHASES), rtol=1e-9)
    assert math.isfinite(result.summary["decode_tokens_per_s"])
