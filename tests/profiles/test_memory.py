"""Memory accounting against PowerInfer-2's published 7 GB breakdown, and budget forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import SimError
from sim.profiles.memory import plan_memory
from sim.profiles.registry import load_device, load_model

# [PI2] arXiv 2406.06282 v3, §7 memory breakdown, TurboSparse-Mixtral-47B at a 7 GB budget.
PI2_7GB_BREAKDOWN_GB = {
    "non_ffn_and_kv": 1.0,  # "non-FFN weights + KV cache 1 GB"
    "predictors": 2.6,  # "predictors 2.6 GB"
    "ffn_scales": 2.7,  # "FFN quantization scales 2.7 GB"
    "runtime": 0.3,  # "runtime 0.3 GB"
    "neuron_cache": 0.4,  # "neuron cache 0.4 GB (= 1.8% of the FFN weights)"
}


@pytest.fixture(scope="module")
def mixtral_7gb():
    return plan_memory(load_model("turbosparse-mixtral-47b"), load_device("oneplus-12"), budget="7GB")


def test_pi2_7gb_breakdown_within_10_percent_per_line(mixtral_7gb):
    plan = mixtral_7gb
    r = plan.resident
    ours = {
        "non_ffn_and_kv": (r["embeddings"] + r["attention"] + r["norms_router"] + r["kv_cache"]) / 1e9,
        "predictors": r["predictors"] / 1e9,
        "ffn_scales": r["ffn_scales"] / 1e9,
        "runtime": r["runtime"] / 1e9,
        "neuron_cache": plan.neuron_cache_bytes / 1e9,
    }
    for line, published in PI2_7GB_BREAKDOWN_GB.items():
        assert ours[line] == pytest.approx(published, rel=0.10), line
    # "= 1.8% of the FFN weights"
    assert plan.ffn_resident_fraction == pytest.approx(0.018, rel=0.10)
    assert plan.budget_bytes == 7_000_000_000


def test_predictor_size_comes_from_its_shape():
    model = load_model("turbosparse-mixtral-47b")
    per = model.predictor.rank * (model.hidden + model.ffn_dim)
    assert model.predictor_bytes == per * model.n_layers * model.n_experts * 2  # fp16, one per expert


def test_offload_and_budget_agree():
    model, device = load_model("turbosparse-mixtral-47b"), load_device("oneplus-12")
    half = plan_memory(model, device, offload=0.5)
    assert half.ffn_resident_fraction == pytest.approx(0.5, abs=1e-6)
    again = plan_memory(model, device, budget=half.budget_bytes)
    assert again.neuron_cache_bytes == half.neuron_cache_bytes


def test_si_and_iec_units_differ():
    model, device = load_model("turbosparse-mixtral-47b"), load_device("oneplus-12")
    si = plan_memory(model, device, budget="12GB")
    iec = plan_memory(model, device, budget="12GiB")
    assert iec.budget_bytes - si.budget_bytes == 12 * 2**30 - 12 * 10**9


def test_percent_budget_is_of_model_weights():
    from sim.profiles.memory import model_weight_bytes

    model, device = load_model("turbosparse-mistral-7b"), load_device("oneplus-12")
    plan = plan_memory(model, device, budget="50%")
    assert plan.budget_bytes == pytest.approx(0.5 * model_weight_bytes(model, "int4"), rel=1e-9)


def test_budget_too_small_prints_breakdown():
    with pytest.raises(SimError) as err:
        plan_memory(load_model("turbosparse-mixtral-47b"), load_device("oneplus-12"), budget="3GB")
    text = str(err.value)
    assert "--memory-budget" in text and "predictors" in text and "ffn_scales" in text and "\n" not in text


def test_budget_above_usable_dram_is_an_error():
    with pytest.raises(SimError, match=r"an app may use"):
        plan_memory(load_model("turbosparse-mixtral-47b"), load_device("oneplus-12"), budget="23GB")


@settings(max_examples=40, deadline=None)
@given(budget_gb=st.floats(min_value=6.7, max_value=19.0))
def test_cache_never_exceeds_ffn_or_budget(budget_gb):
    plan = plan_memory(load_model("turbosparse-mixtral-47b"), load_device("oneplus-12"), budget=f"{budget_gb}GB")
    assert 0 <= plan.neuron_cache_bytes <= plan.ffn_bytes
    assert plan.resident_bytes + plan.neuron_cache_bytes + plan.unused_bytes == plan.budget_bytes


@settings(max_examples=30, deadline=None)
@given(a=st.floats(min_value=0.5, max_value=1.0), b=st.floats(min_value=0.5, max_value=1.0))
def test_more_offload_means_less_cache(a, b):
    model, device = load_model("turbosparse-mixtral-47b"), load_device("oneplus-12")
    lo, hi = sorted((a, b))
    assert plan_memory(model, device, offload=lo).neuron_cache_bytes >= plan_memory(model, device,
                                                                                   offload=hi).neuron_cache_bytes
