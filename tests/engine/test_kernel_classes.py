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
        cluster["kernel_speed"] = {kernel: factor}
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
    base, fast = run(h.device(), "dense"), run(faster("dense_gemv"), "dense")
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
