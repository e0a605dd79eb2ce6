"""sim/traces/derived.py: every model gets a preset, derived from the closest bundled one when it
has none of its own, and says so."""

from __future__ import annotations

import json
import math
import shutil
import typing

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.errors import SimError
from sim.profiles.model import Activation, ModelProfile, MoeSpec, SparsitySpec
from sim.profiles.registry import bundled_names, load_model
from sim.traces import params as params_module
from sim.traces.derived import activation_class, derive_preset, derived_from, preset_for
from sim.traces.params import PROVENANCE_KEYS, SynthDims, preset_names
from sim.traces.stats import trace_stats
from sim.traces.synth import synth_trace

WITHOUT_PRESET = sorted(set(bundled_names("model")) - set(preset_names()))
FAMILIES = list(typing.get_args(ModelProfile.model_fields["family"].annotation))
ACTIVATIONS = list(typing.get_args(Activation))


def _source_model(params) -> ModelProfile:
    return load_model(derived_from(params)["locality"].removeprefix("preset "))


def _variant(base: str, **update) -> ModelProfile:
    """A bundled profile with other attributes (what derivation reads), not written to any file."""
    return load_model(base).model_copy(update=update)


def test_some_bundled_models_have_no_preset_of_their_own():
    assert WITHOUT_PRESET  # else this module tests nothing


@pytest.mark.parametrize("name", WITHOUT_PRESET)
def test_a_model_without_a_preset_gets_a_derived_one_from_its_profile_and_class(name):
    profile = load_model(name)
    params = preset_for(None, profile)
    origins = derived_from(params)
    assert params.name == name and params.made_for == SynthDims.from_model(profile)
    assert origins["density"] == f"model profile {name}"
    assert params.density(params.made_for).mean() == pytest.approx(profile.sparsity.mean_active_fraction)
    source = _source_model(params)
    assert activation_class(source.activation) == activation_class(profile.activation)
    same_family = [n for n in preset_names() if n in bundled_names("model") and load_model(n).family == profile.family
                   and activation_class(load_model(n).activation) == activation_class(profile.activation)]
    if same_family:
        assert source.family == profile.family
    for group, spec in params.groups.items():
        assert spec.get("derived"), group
        assert any(spec.get(k) for k in PROVENANCE_KEYS if k != "derived"), group  # the source's provenance kept
    assert ("routing" in params.groups) == (profile.n_experts > 1) == ("routing" in origins)
    # the same preset by name, whatever the run's model is called (a model renamed by --set model.name)
    assert preset_for(name, profile.model_copy(update={"name": "renamed"})).raw == params.raw


@pytest.mark.parametrize("name", WITHOUT_PRESET)
def test_a_derived_trace_realises_the_profile_density(name):
    profile = load_model(name)
    dims = SynthDims(2, 512, 64, profile.n_experts, profile.top_k, model=name)
    trace = synth_trace(preset_for(name), dims, 12, seed=1)
    assert trace.meta.extra["derived_from"] == derived_from(preset_for(name))
    assert trace_stats(trace)["density_mean"] == pytest.approx(profile.sparsity.mean_active_fraction, rel=0.1)


def test_a_bundled_preset_is_used_as_it_is():
    for name in preset_names():
        assert derived_from(preset_for(name)) is None


@settings(max_examples=40, deadline=None)
@given(base=st.sampled_from(bundled_names("model")), activation=st.sampled_from(ACTIVATIONS),
       family=st.sampled_from(FAMILIES), density=st.floats(0.01, 1.0), experts=st.sampled_from([1, 4, 8]),
       gated=st.booleans())
def test_derivation_keeps_class_prefers_family_and_routes_only_experts(base, activation, family, density, experts,
                                                                       gated):
    model = _variant(base, name="variant", activation=activation, family=family, ffn_gated=gated,
                     sparsity=SparsitySpec(mean_active_fraction=density, source="a test figure"),
                     moe=MoeSpec(n_experts=experts, top_k=2) if experts > 1 else None)
    params = derive_preset(model)
    source = _source_model(params)
    assert activation_class(source.activation) == activation_class(activation)
    candidates = [load_model(n) for n in preset_names() if n in bundled_names("model")]
    if any(c.family == family and activation_class(c.activation) == activation_class(activation)
           for c in candidates):
        assert source.family == family
    assert float(params.density(params.made_for).mean()) == pytest.approx(density)
    assert ("routing" in params.groups) == (experts > 1)
    if experts > 1:
        pop, pers = params.routing(params.made_for)
        assert pop.shape == (model.n_layers, experts) and ((pers >= 0) & (pers < 1)).all()


def test_no_preset_of_the_class_is_a_one_line_error(monkeypatch, tmp_path):
    exact = next(n for n in preset_names() if n in bundled_names("model")
                 and activation_class(load_model(n).activation) == "exact")
    shutil.copy(params_module.PRESET_DIR / f"{exact}.yaml", tmp_path)
    monkeypatch.setattr(params_module, "PRESET_DIR", tmp_path)
    smooth = next(n for n in bundled_names("model") if activation_class(load_model(n).activation) == "thresholded")
    with pytest.raises(SimError, match="no bundled trace preset of a thresholded activation") as err:
        preset_for(smooth)
    assert "\n" not in str(err.value)
    with pytest.raises(SimError, match=r"no synthetic-trace preset 'no-such'.*derived"):
        preset_for("no-such")


def test_a_sweep_point_id_follows_the_presets_a_derived_one_comes_from(monkeypatch, tmp_path):
    from sim.explore.resolve import preset_ref

    name = WITHOUT_PRESET[0]
    before = preset_ref(name, load_model(name))
    source = derived_from(preset_for(name))["locality"].removeprefix("preset ")
    for path in params_module.PRESET_DIR.glob("*.yaml"):
        shutil.copy(path, tmp_path)
    raw = yaml.safe_load((tmp_path / f"{source}.yaml").read_text())
    raw["persistence"]["value"] = 0.5
    (tmp_path / f"{source}.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(params_module, "PRESET_DIR", tmp_path)
    after = preset_ref(name, load_model(name))
    assert before["sha256"] and after["sha256"] and after["sha256"] != before["sha256"]


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_trace_presets_lists_bundled_and_derived_and_shows_one(capsys):
    code, out, _ = _run(capsys, "trace", "presets", "--json")
    assert code == 0, out
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) == set(preset_names()) | set(bundled_names("model"))
    for name, row in rows.items():
        assert row["kind"] == ("bundled" if name in preset_names() else "derived")
        assert (row["derived_from"] is None) == (name in preset_names())
        assert 0 < row["density"] <= 1 and math.isfinite(row["density"])
    code, out, _ = _run(capsys, "trace", "presets", WITHOUT_PRESET[0])
    assert code == 0 and yaml.safe_load(out)["derived_from"] == derived_from(preset_for(WITHOUT_PRESET[0]))
    code, _, err = _run(capsys, "trace", "presets", "no-such")
    assert code == 2 and err.startswith("error: NAME: no synthetic-trace preset 'no-such'") and err.count("\n") == 1


def test_trace_synth_makes_a_derived_models_trace_and_says_so(tmp_path, capsys):
    name = WITHOUT_PRESET[0]
    out = tmp_path / "t.npz"
    code, text, _ = _run(capsys, "trace", "synth", "--model", name, "--tokens", "2", "--out", str(out),
                         "--no-predictions")
    assert code == 0 and out.is_file()
    assert f"derived preset {name}: density from model profile {name}" in text
