"""sim/engine/reevaluate.py: the analytic mode's figure, reusing plans across device edits."""

from __future__ import annotations

import engine_helpers as h
import pytest

from sim.engine import reevaluate
from sim.engine.config import RunConfig
from sim.engine.simulation import simulate
from sim.profiles.edits import edit_device


@pytest.fixture(autouse=True)
def _fresh():
    reevaluate.forget()
    yield
    reevaluate.forget()


@pytest.fixture(scope="module")
def trace():
    return h.trace(h.model(), 30)


def _config(trace, **kw) -> RunConfig:
    base = {"device": h.device(), "model": h.model(), "trace": trace, "decode_tokens": 12, "warmup_tokens": 4,
            "profile_tokens": 8, "prompt_tokens": 8, "offload": 0.6}
    return RunConfig.of(**{**base, **kw})


def _simulated(cfg: RunConfig) -> float:
    return simulate(cfg.model_copy(update={"mode": "analytic"})).summary["decode_tokens_per_s"]


@pytest.mark.parametrize("kw", [{}, {"policy": "s3fifo"}, {"policy": "window"}, {"offload": 0.9},
                                {"knobs": {"hot_share": 0.0}}, {"knobs": {"npu_activation_share": 0.0}},
                                {"knobs": {"split_gate_read": False, "cluster_neurons": 64}},
                                {"knobs": {"pipeline": False}}, {"knobs": {"bundle": False}}, {"knobs": {"xpu": False}},
                                {"knobs": {"neuron_cache": False}}, {"device": "pixel-8-pro"}])
def test_it_gives_the_analytic_runs_figure(trace, kw):
    cfg = _config(trace, **kw)
    first = reevaluate.evaluate(cfg)
    assert not first.reused
    assert first.decode_tokens_per_s == pytest.approx(_simulated(cfg), rel=1e-12)
    tokens = simulate(cfg.model_copy(update={"mode": "analytic"})).tokens
    assert list(first.flash_bytes) == list(tokens["flash_bytes"])


@pytest.mark.parametrize("edits", [{"cpu.clusters.*.int8_gops:scale": 1.4}, {"storage.read_latency_us": 300},
                                   {"dram.combined_gbps:scale": 0.02}, {"npu.int8_tops:scale": 0.001}])
def test_a_device_edit_reuses_the_plans_and_still_agrees(trace, edits):
    reevaluate.evaluate(_config(trace))
    edited = _config(trace, device=edit_device(h.device(), edits))
    again = reevaluate.evaluate(edited)
    assert again.reused
    want = _simulated(edited)
    assert again.decode_tokens_per_s == pytest.approx(want, rel=1e-12)
    assert want != pytest.approx(_simulated(_config(trace)), rel=1e-6)  # the edit matters


@pytest.mark.parametrize("change", [{"offload": 0.7}, {"policy": "fifo"}, {"knobs": {"hot_share": 0.3}},
                                    {"knobs": {"neuron_cache": False}}, {"knobs": {"xpu": False}},
                                    {"decode_tokens": 10}, {"seed": 3}])
def test_what_the_plans_depend_on_makes_new_plans(trace, change):
    reevaluate.evaluate(_config(trace))
    cfg = _config(trace, **change)
    fresh = reevaluate.evaluate(cfg)
    assert not fresh.reused
    assert fresh.decode_tokens_per_s == pytest.approx(_simulated(cfg), rel=1e-12)


def test_removing_the_accelerator_makes_new_plans(trace):
    """Whether an NPU runs the hot share decides which neurons the CPU asks the cache for."""
    reevaluate.evaluate(_config(trace))
    cfg = _config(trace, device=h.device().model_copy(update={"npu": None}))
    fresh = reevaluate.evaluate(cfg)
    assert not fresh.reused
    assert fresh.decode_tokens_per_s == pytest.approx(_simulated(cfg), rel=1e-12)


def test_a_strategy_without_a_split_is_evaluated_whole(trace):
    cfg = _config(trace, strategy="llm-in-flash")
    assert reevaluate.analytic_decode_tokens_per_s(cfg) == pytest.approx(_simulated(cfg), rel=1e-12)
    assert not reevaluate.evaluate(cfg).reused


def test_keyword_options_as_simulate_takes_them(trace):
    kw = {"device": h.device(), "model": h.model(), "trace": trace, "decode_tokens": 6, "warmup_tokens": 2,
          "profile_tokens": 4, "prompt_tokens": 4, "offload": 0.5}
    assert reevaluate.analytic_decode_tokens_per_s(**kw) == pytest.approx(
        simulate(**kw, mode="analytic").summary["decode_tokens_per_s"], rel=1e-12)
