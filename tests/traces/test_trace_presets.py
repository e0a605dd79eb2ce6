"""Bundled presets: sourced, loadable for their models, and the calibrated figures hold."""

from __future__ import annotations

import pytest

from sim.profiles.registry import load_model
from sim.traces.params import PROVENANCE_KEYS, SynthDims, load_preset, preset_names
from sim.traces.stats import trace_stats
from sim.traces.synth import synth_trace

REQUIRED = {"turbosparse-mixtral-47b", "turbosparse-mistral-7b", "bamboo-7b", "opt-6.7b", "falcon-7b",
            "llama-2-7b", "mistral-7b"}


def test_required_presets_exist():
    assert set(preset_names()) >= REQUIRED


@pytest.mark.parametrize("name", preset_names())
def test_every_group_names_its_source_and_matches_the_model_profile(name):
    params = load_preset(name)
    for group, spec in params.groups.items():
        assert any(spec.get(k) for k in PROVENANCE_KEYS), f"{name}: {group} has no source/calibrated/assumed"
    profile = load_model(name)
    assert params.made_for == SynthDims.from_model(profile)
    # the preset's mean density is the model profile's sparsity figure
    assert params.density(params.made_for).mean() == pytest.approx(profile.sparsity.mean_active_fraction, rel=0.02)


def test_opt_preset_reproduces_llm_in_a_flash_window_figures():
    params = load_preset("opt-6.7b")
    assert params.made_for is not None
    s = trace_stats(synth_trace(params, params.made_for, 260, seed=0))
    pred = s["predicted"]
    # [FLASH] §3.1/§4.1: ~10% of the FFN per token without a window, 2.4% with k = 5, window holds 24%
    for got, want in ((pred["window_new_share"][0], 0.10), (pred["window_new_share"][5], 0.024),
                      (pred["window_union_share"][5], 0.24)):
        assert abs(got / want - 1) < 0.15, (got, want)
    # [FLASH] Table 6: 3.30% active on average
    assert abs(s["density_mean"] / 0.033 - 1) < 0.03
