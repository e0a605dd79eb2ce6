"""sim/explore/ablation.py: ladders of a strategy's mechanisms, their rungs' knobs, a ladder's runs.

The rungs' knobs are checked against the strategies' own mechanism tables for any ladder
(hypothesis); a run of a ladder uses the tiny MoE model on the Mixtral preset, so each rung
takes milliseconds.
"""

from __future__ import annotations

import explore_helpers as eh
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.engine.config import RunConfig
from sim.engine.strategies import REGISTRY, get_strategy
from sim.errors import SimError
from sim.explore.ablation import BASELINE, knobs_for_rung, ladder_of, run_ladder, rung_knobs, rung_names

ABLATABLE = sorted(name for name, cls in REGISTRY.items() if cls.mechanisms)


@st.composite
def ladders(draw):
    strategy = get_strategy(draw(st.sampled_from(ABLATABLE)))
    names = draw(st.permutations(list(strategy.mechanisms)))
    return strategy, names[:draw(st.integers(1, len(names)))]


@given(ladders())
def test_each_rung_switches_off_exactly_the_mechanisms_it_has_not_added_yet(case):
    strategy, ladder = case
    default = strategy.knobs_model()
    for i in range(len(ladder) + 1):
        knobs = rung_knobs(strategy, ladder, i)
        off = {k for name in ladder[i:] for k in strategy.mechanisms[name]}
        assert set(knobs) == off
        for knob, value in knobs.items():
            assert value != getattr(default, knob)  # switching off changes the knob from its default
        strategy.knobs_model(**knobs)  # every rung is a valid set of knobs
    assert rung_knobs(strategy, ladder, len(ladder)) == {}
    assert rung_names(ladder) == [BASELINE, *(f"+{n}" for n in ladder)]
    assert knobs_for_rung(strategy, BASELINE, ladder) == rung_knobs(strategy, ladder, 0)
    assert knobs_for_rung(strategy, ladder[-1], ladder) == {}


def test_the_default_ladders_are_the_papers():
    assert ladder_of(get_strategy("powerinfer2")) == ["bundle", "neuron_cache", "pipeline", "xpu"]
    assert ladder_of(get_strategy("llm-in-flash")) == ["hybrid", "predictor", "window", "bundling"]
    assert ladder_of(get_strategy("powerinfer2"), " pipeline,bundle") == ["pipeline", "bundle"]


@pytest.mark.parametrize(("strategy", "ladder", "field", "message"), [
    ("powerinfer2", "bundle,warp", "--ladder", "unknown mechanism 'warp'; powerinfer2's mechanisms: bundle, "),
    ("powerinfer2", "xpu,xpu", "--ladder", "names 'xpu' twice"),
    ("powerinfer2", ",", "--ladder", "expected comma-separated mechanism names"),
    ("llm-in-flash", "bundle", "--ladder", "llm-in-flash's mechanisms: hybrid, predictor, window, bundling"),
    ("dense", None, "--strategy", "the dense strategy has no mechanisms to switch; ablate one of: llm-in-flash, "),
])
def test_a_bad_ladder_names_the_flag_and_what_is_allowed(strategy, ladder, field, message):
    with pytest.raises(SimError) as err:
        ladder_of(get_strategy(strategy), ladder)
    assert err.value.field == field and message in err.value.detail


def test_an_unknown_rung_lists_the_rungs():
    with pytest.raises(SimError, match="unknown rung 'cache'; the ladder's rungs: baseline, bundle, neuron_cache"):
        knobs_for_rung(get_strategy("powerinfer2"), "cache")


def _config(tmp_path, **kw) -> RunConfig:
    model = eh.write_model(tmp_path)
    return RunConfig.of(model=str(model), preset=eh.PRESET, offload=0.8, decode_tokens=4, warmup_tokens=4,
                        prompt_tokens=8, **kw)


def test_a_ladder_runs_the_baseline_and_one_rung_per_mechanism(tmp_path):
    table = run_ladder(_config(tmp_path), "neuron_cache,bundle")
    assert list(table["rung"]) == ["baseline", "+neuron_cache", "+bundle"]
    assert list(table["knobs"]) == [{"neuron_cache": False, "bundle": False}, {"bundle": False}, {}]
    tps = table["decode_tokens_per_s"].to_numpy()
    np.testing.assert_allclose(table["speedup"].to_numpy()[1:], tps[1:] / tps[:-1])
    np.testing.assert_allclose(table["speedup_total"], tps / tps[0])
    assert np.isnan(table["speedup"].iloc[0])
    assert table["cache_hit_ratio"].iloc[1] > table["cache_hit_ratio"].iloc[0]  # the dynamic cache on
    assert table["flash_bytes_per_token"].iloc[2] < table["flash_bytes_per_token"].iloc[1]  # bundled reads
    assert set(table["bottleneck"]) <= {"cpu", "flash", "npu", "gpu"}


def test_a_knob_the_ladder_switches_cannot_be_set_too(tmp_path):
    with pytest.raises(SimError, match="the ladder switches xpu") as err:
        run_ladder(_config(tmp_path, knobs={"xpu": True}), "xpu")
    assert err.value.field == "--set xpu"
    assert len(run_ladder(_config(tmp_path, knobs={"xpu": False}), "bundle")) == 2  # outside the ladder it stays
