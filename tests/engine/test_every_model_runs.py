"""Every bundled model runs with every strategy on its own preset, bundled or derived (issue 19,
item 5), and the run says which.

Each model is cut to two layers (its width, experts, activation and sparsity kept), so a
run takes milliseconds; what is checked is that the preset resolves for the model and
every strategy can run the trace it gives, not the figures.
"""

from __future__ import annotations

import math

import pytest

import sim
from sim.engine.simulation import simulate
from sim.engine.strategies import REGISTRY
from sim.profiles.registry import bundled_names
from sim.traces.params import preset_names


@pytest.mark.parametrize("strategy", sorted(REGISTRY))
@pytest.mark.parametrize("name", bundled_names("model"))
def test_every_bundled_model_runs_with_every_strategy(name, strategy):
    model = sim.edit_model(name, {"n_layers": 2})
    result = simulate("oneplus-12", model, strategy, prompt_tokens=4, decode_tokens=2, warmup_tokens=1,
                      profile_tokens=2)
    s = result.summary
    assert s["decode_tokens_per_s"] > 0 and math.isfinite(s["decode_tokens_per_s"])
    assert s["trace_source"] == "synthetic" and s["trace_preset"] == name
    derived = s["trace_derived_from"]
    assert (not derived) == (name in preset_names())
    if derived:
        assert derived["density"] == f"model profile {name}" and derived["locality"].startswith("preset ")
        assert ("routing" in derived) == (model.n_experts > 1)


def test_a_given_trace_has_no_preset(tmp_path):
    from sim.traces.derived import preset_for
    from sim.traces.params import SynthDims
    from sim.traces.synth import write_synthetic

    name = bundled_names("model")[0]
    model = sim.edit_model(name, {"n_layers": 2})
    path, _ = write_synthetic(tmp_path / "t.npz", preset_for(name), SynthDims.from_model(model), 8, 0)
    s = simulate("oneplus-12", model, sorted(REGISTRY)[0], trace=path, prompt_tokens=4, decode_tokens=2,
                 warmup_tokens=1).summary
    assert s["trace_preset"] is None and s["trace_derived_from"] == {}
