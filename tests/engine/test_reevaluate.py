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


@pytest.mark.parametrize("offload", [0.2, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("kw", [{}, {"knobs": {"npu_activation_share": 0.0}}, {"knobs": {"hot_share": 0.2}},
                                {"device": "pixel-8-pro"}])
def test_one_pass_agrees_with_the_replay_at_every_budget(trace, offload, kw):
    """The one-pass answer across budgets (PowerInfer-2, LRU cold region) against the replay
    at budgets from a nearly whole FFN in DRAM to almost none of it. This model's layers hold
    ~450 neurons a token against cold regions of a few hundred, the hardest case for counting
    distances in whole tokens (Mixtral's answers are within 0.5%: benchmarks/analytic_reeval.py)."""
    cfg = _config(trace, offload=offload, **kw)
    got = reevaluate.evaluate(cfg, one_pass=True)
    assert got.one_pass
    assert got.decode_tokens_per_s == pytest.approx(_simulated(cfg), rel=0.02)
    want = simulate(cfg.model_copy(update={"mode": "analytic"})).tokens["flash_bytes"].sum()
    assert got.flash_bytes.sum() == pytest.approx(want, rel=0.03)


def test_one_pass_reads_the_trace_once_for_every_budget(trace):
    assert not reevaluate.evaluate(_config(trace, offload=0.4), one_pass=True).reused
    assert reevaluate.evaluate(_config(trace, offload=0.8), one_pass=True).reused
    assert reevaluate.evaluate(_config(trace, offload=0.8, knobs={"hot_share": 0.3}), one_pass=True).reused
    assert not reevaluate.evaluate(_config(trace, offload=0.8, seed=3), one_pass=True).reused


@pytest.mark.parametrize("kw", [{"policy": "s3fifo"}, {"policy": "window"}, {"knobs": {"neuron_cache": False}},
                                {"strategy": "llm-in-flash"}])
def test_one_pass_replays_where_it_has_no_answer(trace, kw):
    cfg = _config(trace, **kw)
    got = reevaluate.evaluate(cfg, one_pass=True)
    assert not got.one_pass
    assert got.decode_tokens_per_s == pytest.approx(_simulated(cfg), rel=1e-12)
