"""Compute on the GPU or NPU: the ``prefill_unit`` and ``decode_unit`` knobs.

A step moved to an accelerator is one call at the unit's efficiency for its batch, in the
DES (per-step events and closed stretches alike) and in the analytic sum; a unit the
phone lacks, or two knobs that disagree, is a one-line error naming the knob.
"""

from __future__ import annotations

import json

import engine_helpers as h
import numpy as np
import pandas as pd
import pytest

from sim.cli import main
from sim.engine.machine import Machine
from sim.engine.simulation import simulate
from sim.errors import SimError

GPU_FLASH = {"decode_unit": "gpu", "prefill_unit": "gpu"}


def run(strategy: str, knobs: dict, device=None, **kw):
    m = h.model(h.TINY_MOE)
    opts = {"offload": 0.5} if strategy != "dense" else {}
    opts.update(kw)
    return simulate(device or h.device(), m, strategy, trace=h.trace(m, 14), decode_tokens=10, prompt_tokens=8,
                    warmup_tokens=4, knobs=knobs, **opts)


@pytest.mark.parametrize(("strategy", "knobs"), [("llm-in-flash", GPU_FLASH), ("llamacpp", {"prefill_unit": "gpu"}),
                                                 ("dense", {"prefill_unit": "npu"})])
def test_accelerator_steps_agree_in_closed_stretches_per_step_events_and_analytic_sums(strategy, knobs,
                                                                                         monkeypatch):
    closed = run(strategy, knobs)
    analytic = run(strategy, knobs, mode="analytic")
    monkeypatch.setattr(Machine, "compiled_phases", False)  # every step its own simpy events: the reference
    reference = run(strategy, knobs)
    pd.testing.assert_frame_equal(closed.tokens, reference.tokens, check_exact=True)
    assert h.summary_without_wall(closed.summary) == h.summary_without_wall(reference.summary)
    np.testing.assert_allclose(analytic.tokens["latency_s"], closed.tokens["latency_s"], rtol=1e-9)


def test_decode_on_the_gpu_busies_the_gpu_not_the_compute_threads_and_reads_the_same():
    cpu = run("llm-in-flash", {})
    gpu = run("llm-in-flash", GPU_FLASH)
    assert "gpu" not in cpu.summary["utilisation"]
    assert gpu.summary["utilisation"]["gpu"] > 0
    # The same window, the same reads: only where the products run changes.
    np.testing.assert_array_equal(cpu.tokens["flash_bytes"], gpu.tokens["flash_bytes"])
    np.testing.assert_array_equal(cpu.tokens["misses"], gpu.tokens["misses"])
    assert not np.allclose(cpu.tokens["attention_s"], gpu.tokens["attention_s"])
    # Compute threads still copy rows into the preallocated matrix (memory management), nothing else.
    busy_cpu = sum(v for k, v in gpu.summary["utilisation"].items() if k.startswith("cpu:"))
    assert busy_cpu < sum(v for k, v in cpu.summary["utilisation"].items() if k.startswith("cpu:"))


def test_prefill_unit_changes_prefill_only_and_follows_the_units_speed():
    base = h.device_data()
    faster = h.device_data()
    faster["gpu"]["int8_tops"] *= 4
    faster["gpu"]["fp16_tflops"] *= 4
    on_cpu = run("dense", {})
    on_gpu = run("dense", {"prefill_unit": "gpu"}, device=h.device(base))
    on_faster_gpu = run("dense", {"prefill_unit": "gpu"}, device=h.device(faster))
    cpu_on_faster_gpu_phone = run("dense", {}, device=h.device(faster))
    assert (on_gpu.tokens.pop("busy_gpu_s") == 0).all()  # the GPU worked in prefill only
    # decode untouched (the clock starts later, so differences of times round differently)
    pd.testing.assert_frame_equal(on_cpu.tokens, on_gpu.tokens, check_exact=False, rtol=1e-9)
    assert on_gpu.summary["ttft_s"] != on_cpu.summary["ttft_s"]
    assert on_faster_gpu.summary["ttft_s"] < on_gpu.summary["ttft_s"]
    assert cpu_on_faster_gpu_phone.summary["ttft_s"] == on_cpu.summary["ttft_s"]


def test_powerinfer2_prefill_unit_overrides_the_npu_default():
    npu = run("powerinfer2", {})
    gpu = run("powerinfer2", {"prefill_unit": "gpu"})
    cpu = run("powerinfer2", {"prefill_unit": "cpu"})
    legacy_cpu = run("powerinfer2", {"prefill_on_npu": False})
    assert len({npu.summary["ttft_s"], gpu.summary["ttft_s"], cpu.summary["ttft_s"]}) == 3
    assert legacy_cpu.summary["ttft_s"] == cpu.summary["ttft_s"]


def test_a_unit_the_phone_lacks_is_refused_naming_the_knob():
    data = h.device_data()
    del data["gpu"]
    with pytest.raises(SimError, match="has no gpu; choose one of cpu, npu") as err:
        run("llm-in-flash", {"decode_unit": "gpu"}, device=h.device(data))
    assert err.value.field == "decode_unit"


def test_contradicting_prefill_knobs_are_refused_naming_the_unit():
    with pytest.raises(SimError, match="prefill_on_npu: false contradicts prefill_unit: npu") as err:
        run("powerinfer2", {"prefill_unit": "npu", "prefill_on_npu": False})
    assert "prefill_unit" in str(err.value.field)


def test_cli_names_the_knob_in_one_line(capsys):
    args = ["run", "--device", "macbook-pro-m1-max", "--model", "opt-6.7b", "--strategy", "llm-in-flash",
            "--set", "prefill_unit=npu", "--decode-tokens", "2", "--json"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "prefill_unit: " in err and "macbook-pro-m1-max has no npu; choose one of cpu, gpu" in err, err


def test_cli_runs_llm_in_a_flash_on_the_gpu(capsys):
    args = ["run", "--device", "macbook-pro-m1-max", "--model", "opt-6.7b", "--strategy", "llm-in-flash",
            "--weights-dtype", "fp16", "--offload", "0.76", "--decode-tokens", "4", "--warmup-tokens", "4",
            "--set", "decode_unit=gpu", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["utilisation"]["gpu"] > 0 and out["config"]["knobs"]["decode_unit"] == "gpu"


def test_predicted_rows_cost_the_whole_matrix_on_a_unit_without_gathered_row_kernels():
    """In memory llm-in-flash multiplies only the predicted rows: a gathered product, which a
    GPU without sparse kernels (the bundled profiles) runs over every row of the experts."""
    with_kernels = h.device_data()
    with_kernels["gpu"]["sparse_kernels"] = True
    dense_gpu = run("llm-in-flash", GPU_FLASH, offload=0.0)
    sparse_gpu = run("llm-in-flash", GPU_FLASH, device=h.device(with_kernels), offload=0.0)
    assert dense_gpu.summary["flash_bytes_per_token"] == 0
    ratio = dense_gpu.tokens["ffn_s"].sum() / sparse_gpu.tokens["ffn_s"].sum()
    m = h.model(h.TINY_MOE)
    predicted_share = dense_gpu.tokens["requests"].sum() / (len(dense_gpu.tokens) * m.n_layers * m.top_k * m.ffn_dim)
    assert ratio > 1.5 and predicted_share < 0.6
    np.testing.assert_allclose(dense_gpu.tokens["attention_s"], sparse_gpu.tokens["attention_s"], rtol=1e-9)


def test_offloaded_predicted_rows_on_such_a_unit_cost_the_window_not_weights_left_on_flash():
    """With half the FFN on flash, a unit without gathered-row kernels multiplies the matrix
    that holds the predicted rows (the window's), never rows that were not loaded."""
    window = run("llm-in-flash", GPU_FLASH)
    predicted = run("llm-in-flash", {**GPU_FLASH, "compute_rows": "predicted"})
    np.testing.assert_array_equal(window.tokens["ffn_s"], predicted.tokens["ffn_s"])
    assert window.summary["flash_bytes_per_token"] > 0


def test_a_speedup_point_without_its_baseline_is_refused():
    from sim import validation

    point = {"id": "x", "source": "s", "device": "oneplus-12", "model": "turbosparse-mistral-7b",
             "strategy": "llm-in-flash", "metric": "speedup", "published": 2.0}
    with pytest.raises(SimError, match="a speedup needs baseline_knobs"):
        validation.run_point(point, decode_tokens=2, warmup_tokens=0)


def test_the_hot_share_on_the_gpu_replaces_the_npu_in_decode():
    npu = run("powerinfer2", {})
    gpu = run("powerinfer2", {"hot_unit": "gpu"})
    assert npu.summary["utilisation"]["npu"] > 0 and "gpu" not in npu.summary["utilisation"]
    assert gpu.summary["utilisation"]["gpu"] > 0
    assert gpu.tokens.get("busy_npu_s", pd.Series([0.0])).sum() == 0  # the NPU only prefills
    # The same neurons go to the accelerator, so the CPU's clusters and reads are unchanged.
    np.testing.assert_array_equal(npu.tokens["flash_bytes"], gpu.tokens["flash_bytes"])
    np.testing.assert_array_equal(npu.tokens["misses"], gpu.tokens["misses"])
    assert not np.array_equal(npu.tokens["latency_s"], gpu.tokens["latency_s"])


def test_a_hot_unit_the_phone_lacks_is_refused_but_the_default_falls_back_to_the_cpu():
    data = h.device_data()
    del data["gpu"], data["npu"]
    with pytest.raises(SimError, match="has no gpu; leave it out to run on the CPU") as err:
        run("powerinfer2", {"hot_unit": "gpu"}, device=h.device(data))
    assert err.value.field == "hot_unit"
    cpu_only = run("powerinfer2", {}, device=h.device(data))
    assert not {"npu", "gpu"} & set(cpu_only.summary["utilisation"])


def _converting_npu():
    data = h.device_data()
    data["npu"]["formats"] = ["int8", "fp16"]  # INT4 weights must be dequantized by the CPU first
    return h.device(data)


def _prefill_spans(result, name, unit_prefix):
    return [(s.start_s, s.end_s) for s in result.spans
            if s.token == -1 and s.name == name and s.unit.startswith(unit_prefix)]


@pytest.mark.parametrize("strategy", ["powerinfer2", "dense"])
def test_an_npu_that_cannot_take_int4_waits_for_the_cpu_to_convert_each_layer(strategy):
    knobs = {} if strategy == "powerinfer2" else {"prefill_unit": "npu"}
    kw = {"offload": 0.0} if strategy != "dense" else {}
    native = run(strategy, knobs, timeline=True, **kw)
    converted = run(strategy, knobs, device=_converting_npu(), timeline=True, **kw)
    assert not _prefill_spans(native, "dequantize", "cpu:")
    conv = _prefill_spans(converted, "dequantize", "cpu:")
    npu = _prefill_spans(converted, "prefill", "npu")
    m = h.model(h.TINY_MOE)
    assert len(npu) == m.n_layers and conv
    assert converted.summary["ttft_s"] > native.summary["ttft_s"]
    # Every layer's NPU job starts after its weights are converted.
    conv_ends = sorted({end for _, end in conv})
    assert all(start >= conv_ends[i] for i, (start, _) in enumerate(sorted(npu)))
    overlap = any(s < e2 and s2 < e for s, e in conv for s2, e2 in npu)
    # PowerInfer-2 converts the next layer while the NPU runs this one; the serial strategies do not.
    assert overlap == (strategy == "powerinfer2")


def test_conversion_goes_to_the_narrowest_format_the_unit_takes():
    from sim.hw.processors import accel_format

    acc = h.device().npu
    assert accel_format(acc, "int4") is None
    assert accel_format(acc.model_copy(update={"formats": ["int8", "fp16"]}), "int4") == "int8"
    assert accel_format(acc.model_copy(update={"formats": ["fp16"]}), "int4") == "fp16"
    assert accel_format(acc.model_copy(update={"formats": ["fp16"]}), "fp16") is None
    assert accel_format(acc.model_copy(update={"formats": ["fp16"]}), "int8") == "fp16"
    # Float weights are never "dequantised", whatever the unit lists.
    assert accel_format(acc.model_copy(update={"formats": ["int8", "int4"]}), "fp16") is None
    assert accel_format(acc.model_copy(update={"formats": ["int8"]}), "fp32") is None


def test_bundled_profiles_convert_nothing_in_any_format():
    for dtype in ("int4", "int8", "fp16", "fp32"):
        result = run("dense", {"prefill_unit": "npu"}, timeline=True, weights_dtype=dtype)
        assert not _prefill_spans(result, "dequantize", "cpu:"), dtype


def test_prefill_utilisation_shows_which_unit_bounds_the_prompt():
    native = run("powerinfer2", {}, offload=0.0)
    converted = run("powerinfer2", {}, device=_converting_npu(), offload=0.0)
    analytic = run("powerinfer2", {}, offload=0.0, mode="analytic")
    assert "prefill_utilisation" not in analytic.summary  # the cost model has no prefill schedule
    cpu = [v for k, v in converted.summary["prefill_utilisation"].items() if k.startswith("cpu:")]
    # Converting the weights keeps the compute threads busier than the NPU that waits for them.
    assert min(cpu) > converted.summary["prefill_utilisation"]["npu"]
    assert native.summary["prefill_utilisation"]["npu"] > converted.summary["prefill_utilisation"]["npu"]
    assert all(0 < v <= 1 for v in converted.summary["prefill_utilisation"].values())
