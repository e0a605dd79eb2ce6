"""CPU kernel classes: a profile's per-kernel speed moves exactly the phases that run it.

Decode's attention, predictors and LM head are dense GEMVs, PowerInfer-2's neuron
clusters are sparse GEMVs over gathered rows, and every prefill is a GEMM
(``sim.profiles.device.KernelSpeed``). Doubling one class's speed must leave the phases
of the other classes untouched and never slow the run.
"""

from __future__ import annotations

import engine_helpers as h
import pandas as pd
import pytest

from sim.engine.machine import Machine
from sim.engine.simulation import simulate

KW = {"decode_tokens": 8, "prompt_tokens": 8, "warmup_tokens": 2}


def faster(kernel: str, factor: float = 2.0):
    data = h.device_data()
    for cluster in data["cpu"]["clusters"]:
        speeds = dict(cluster.get("kernel_speed") or {})
        speeds[kernel] = speeds.get(kernel, 1.0) * factor
        cluster["kernel_speed"] = speeds
    return h.device(data)


def run(device, strategy: str = "powerinfer2", **kw):
    m = h.model(h.TINY_DENSE)
    return simulate(device, m, strategy, trace=h.trace(m, 12), **{**KW, **kw})


def test_sparse_gemv_speeds_up_only_the_clusters():
    kw = {"offload": 0.0, "knobs": {"npu_activation_share": 0}}  # every FFN neuron on the CPU
    base, fast = run(h.device(), **kw), run(faster("sparse_gemv"), **kw)
    assert fast.summary["prefill_tokens_per_s"] == base.summary["prefill_tokens_per_s"]
    for phase in ("attention_s", "predictor_s", "lm_head_s"):
        pd.testing.assert_series_equal(fast.tokens[phase], base.tokens[phase])
    assert fast.tokens["ffn_s"].sum() < base.tokens["ffn_s"].sum()
    assert fast.summary["decode_tokens_per_s"] > base.summary["decode_tokens_per_s"]


def test_dense_gemv_speeds_up_decode_of_dense_layers_only():
    # the bundled phone's dense GEMV already streams at the DRAM's rate, so compare it with a slower one
    base, fast = run(faster("dense_gemv", 0.25), "dense"), run(h.device(), "dense")
    # Prefill is GEMMs but ends with the LM head of the last prompt token, a GEMV.
    assert fast.summary["prefill_tokens_per_s"] >= base.summary["prefill_tokens_per_s"]
    assert fast.summary["decode_tokens_per_s"] >= base.summary["decode_tokens_per_s"]
    assert fast.tokens["attention_s"].sum() < base.tokens["attention_s"].sum()


def test_gemm_speeds_up_prefill_only():
    for strategy in ("dense", "powerinfer2", "llm-in-flash", "llamacpp"):
        kw = {} if strategy == "dense" else {"offload": 0.0, "knobs": {"prefill_on_npu": False}} \
            if strategy == "powerinfer2" else {"offload": 0.0}
        base, fast = run(h.device(), strategy, **kw), run(faster("gemm"), strategy, **kw)
        pd.testing.assert_series_equal(fast.tokens["latency_s"], base.tokens["latency_s"])
        assert fast.summary["prefill_tokens_per_s"] > base.summary["prefill_tokens_per_s"], strategy


@pytest.mark.parametrize("offload", [0.0, 0.6])
def test_compiled_phase_uses_the_sparse_rate_like_the_cluster_processes(offload, monkeypatch):
    device = faster("sparse_gemv", 1.7)
    compiled = run(device, offload=offload)
    monkeypatch.setattr(Machine, "compiled_phases", False)
    reference = run(device, offload=offload)
    pd.testing.assert_frame_equal(compiled.tokens, reference.tokens, check_exact=False, rtol=1e-9, atol=1e-15)


def test_the_bundled_phone_decodes_a_dense_7b_model_at_its_measured_cpu_bandwidth():
    """[PI2 §2.3]: the OnePlus 12's CPU alone reaches 43.9 GB/s running a 7B model (a decode).

    The profile's dense-GEMV speed is derived from that figure (see oneplus-12.yaml), so a
    dense INT4 Mistral-7B decode on the six compute cores must be bandwidth-bound at it,
    not compute-bound below it; prefill stays at its own calibration (8 tokens/s).
    """
    from sim.engine.costs import ModelCosts
    from sim.profiles.registry import load_device, load_model

    model, device = load_model("mistral-7b"), load_device("oneplus-12")
    result = simulate(device, model, "dense", trace=None, decode_tokens=4, prompt_tokens=64, warmup_tokens=1,
                      profile_tokens=0, preset="mistral-7b", weights_dtype="int4")
    costs = ModelCosts(model, "int4")
    layer = costs.attention(66) + costs.router() + costs.dense_ffn()
    token_bytes = model.n_layers * layer.weight_bytes + costs.lm_head().weight_bytes
    achieved_gbps = token_bytes / (result.summary["latency_ms_mean"] / 1e3) / 1e9
    assert achieved_gbps == pytest.approx(device.cpu.mem_gbps, rel=0.02)
    assert result.summary["prefill_tokens_per_s"] == pytest.approx(8.0, rel=0.02)
