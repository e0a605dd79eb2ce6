"""Sweep specs: expansion order, sampling, dotted-path overrides and stable point ids."""

from __future__ import annotations

import numpy as np
import pytest
from explore_helpers import base, write_model
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.errors import SimError
from sim.explore.spec import RangeAxis, SampleSpec, expand, sample_points, spec_from_mapping
from sim.profiles.edits import apply_path
from sim.profiles.registry import load_device


@pytest.fixture()
def folder(tmp_path):
    write_model(tmp_path)
    return tmp_path


def points(folder, **spec):
    return expand(spec_from_mapping({"base": base(), **spec}), folder)


def test_grid_points_seeds_cross_in_order(folder):
    pts = points(folder, grid={"memory_budget": ["302MB", "303MB"], "strategy": ["powerinfer2", "llamacpp"]},
                 points=[{"decode_tokens": 4}, {"decode_tokens": 6}], seeds=[0, 1])
    assert len(pts) == 2 * 2 * 2 * 2
    axes = [tuple(p.axes.values()) for p in pts]
    assert axes[0] == ("302MB", "powerinfer2", 4, 0)
    assert axes[1] == ("302MB", "powerinfer2", 4, 1)  # the last block varies fastest
    assert axes[-1] == ("303MB", "llamacpp", 6, 1)
    assert len({p.id for p in pts}) == len(pts)
    assert all(p.error is None for p in pts)
    assert {p.task["run"]["decode_tokens"] for p in pts} == {4, 6}


@pytest.mark.parametrize(("spec", "field", "other"), [
    ({"grid": {"seed": [0, 1]}, "seeds": [0, 1]}, "seeds", "grid.seed"),
    ({"grid": {"memory_budget": ["302MB", "303MB"]}, "points": [{"strategy": "llamacpp"}, {"memory_budget": "304MB"}]},
     "points.1.memory_budget", "grid.memory_budget"),
])
def test_a_setting_varied_in_two_places_is_a_spec_error(folder, spec, field, other):
    """Otherwise one block's values overwrite the other's and the sweep silently has fewer points."""
    with pytest.raises(SimError) as info:
        points(folder, **spec)
    assert info.value.field == field and other in str(info.value)


def test_one_configuration_one_id_whatever_the_spelling(folder):
    spelled = points(folder, points=[
        {"memory_budget": "302MB"},
        {"memory_budget": 302_000_000},
        {"memory_budget": "302MB", "knobs.cluster_neurons": 512},  # the default value
        {"memory_budget": "302MB", "device.dram.usable_bytes": "19GB"},  # the profile's own value
    ])
    assert len({p.id for p in spelled}) == 1
    different = points(folder, points=[{"memory_budget": "302MB", "knobs.cluster_neurons": 256},
                                       {"memory_budget": "302MB", "seed": 1},
                                       {"memory_budget": "302MB", "device.storage.read_latency_us": 90}])
    assert len({p.id for p in different} | {spelled[0].id}) == 4


def test_id_covers_project_version_and_preset_content(folder, monkeypatch, tmp_path_factory):
    first = points(folder, points=[{"memory_budget": "302MB"}])[0]
    monkeypatch.setattr(sim, "__version__", "999.0")
    assert points(folder, points=[{"memory_budget": "302MB"}])[0].id != first.id
    monkeypatch.undo()
    import sim.traces.params as params

    presets = tmp_path_factory.mktemp("presets")
    text = (params.PRESET_DIR / "turbosparse-mixtral-47b.yaml").read_text()
    (presets / "turbosparse-mixtral-47b.yaml").write_text(text + "\n# edited\n")
    monkeypatch.setattr(params, "PRESET_DIR", presets)
    assert points(folder, points=[{"memory_budget": "302MB"}])[0].id != first.id


def test_profile_overrides_by_index_name_wildcard_and_scale(folder):
    pts = points(folder, points=[
        {"device.cpu.clusters.big.cores": 2},
        {"device.cpu.clusters.0.io_4k_gbps": 1.2},
        {"device.storage.rand_read.*.gbps:scale": 2.0},
        {"device.storage.seq_read.*.gbps": 1.5},
        {"device.dram.usable_bytes:scale": 0.5},
    ])
    ref = load_device("oneplus-12")
    d = [p.task["device"] for p in pts]
    assert d[0]["cpu"]["clusters"][0]["cores"] == 2
    assert d[1]["cpu"]["clusters"][0]["io_4k_gbps"] == 1.2
    assert [x["gbps"] for x in d[2]["storage"]["rand_read"]] == [2 * x.gbps for x in ref.storage.rand_read]
    assert {x["gbps"] for x in d[3]["storage"]["seq_read"]} == {1.5}
    assert d[4]["dram"]["usable_bytes"] == ref.dram.usable_bytes // 2
    assert isinstance(d[4]["dram"]["usable_bytes"], int)
    assert len({p.task["device_hash"] for p in pts}) == 5


def test_bundled_axis_sets_several_fields_under_one_label(folder):
    pts = points(folder, grid={"flash": [{"label": "slow", "device.storage.rand_read.*.gbps:scale": 0.5,
                                          "device.storage.read_latency_us": 150},
                                         {"label": "stock"}]})
    assert [p.axes for p in pts] == [{"flash": "slow"}, {"flash": "stock"}]
    assert pts[0].task["device"]["storage"]["read_latency_us"] == 150
    assert pts[1].task["device"]["storage"]["read_latency_us"] == load_device("oneplus-12").storage.read_latency_us


@pytest.mark.parametrize(("values", "label", "second"), [
    ([{"label": "a", "device.storage.read_latency_us": 150}, {"label": "a"}], "'a'", 1),
    ([{"label": 1, "device.storage.read_latency_us": 150}, {}], "1", 1),  # unlabelled: its index
])
def test_two_bundles_with_one_label_are_refused(folder, values, label, second):
    """They were averaged into one plotted point by sweep plot/heatmap without a note (issue 18)."""
    with pytest.raises(SimError) as info:
        points(folder, grid={"flash": values})
    assert info.value.field == f"grid.flash.{second}.label"
    assert f"label {label} is used by bundles" in str(info.value)


def test_a_plain_axis_may_repeat_a_value():
    """Repeated plain values are replicates, as before; only bundle labels must differ."""
    spec = spec_from_mapping({"base": base(), "grid": {"decode_tokens": [4, 4]}})
    assert len(expand(spec)) == 2


def test_misspelt_field_is_a_spec_error_but_an_invalid_value_fails_only_its_point(folder):
    with pytest.raises(SimError, match="no field 'seq_red'"):
        points(folder, grid={"device.storage.seq_red": [1]})
    with pytest.raises(SimError, match="unknown setting 'memory_budgt'"):
        points(folder, grid={"memory_budgt": ["1GB"]})
    pts = points(folder, grid={"device.dram.usable_bytes": ["30GB", "12GB"], "knobs.cluster_neurons": [0, 64]})
    failed = [p for p in pts if p.error]
    assert len(failed) == 3  # usable above total (2 points) and cluster_neurons 0 (1 more)
    assert any("usable_bytes" in p.error and "must not exceed total_bytes" in p.error for p in failed)
    assert any("cluster_neurons" in p.error for p in failed)
    ok = [p for p in pts if not p.error]
    assert len(ok) == 1 and ok[0].task["knobs"]["cluster_neurons"] == 64


def test_a_knob_given_twice_in_base_is_refused():
    """base.knobs and a base.knobs.<name> key for the same knob: one would silently win."""
    with pytest.raises(SimError, match=r"base\.knobs\.cluster_neurons: sets cluster_neurons as base\.knobs does too"):
        expand(spec_from_mapping({"base": {"knobs": {"cluster_neurons": 128}, "knobs.cluster_neurons": 256}}))


@pytest.mark.parametrize("bad, match", [
    ({"grid": {"memory_budget": []}}, "grid.memory_budget"),
    ({"grdi": {}}, "grdi: unknown field"),
    ({"sample": {"n": 0, "ranges": {"seed": {"low": 0, "high": 3}}}}, "sample.n"),
    ({"sample": {"n": 2, "seed": -1, "ranges": {"offload": {"low": 0.1, "high": 0.9}}}}, "sample.seed: must be >= 0"),
    ({"seeds": "zero"}, "seeds"),
])
def test_spec_schema_errors_are_one_line(bad, match):
    with pytest.raises(SimError, match=match) as info:
        spec_from_mapping({"base": {}, **bad})
    assert "\n" not in str(info.value)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), lo=st.floats(-1e3, 1e3), width=st.floats(1e-3, 1e3))
def test_latin_hypercube_puts_one_sample_in_each_stratum(n, seed, lo, width):
    spec = SampleSpec(method="lhs", n=n, seed=seed, ranges={"offload": RangeAxis(low=lo, high=lo + width),
                                                            "knobs.hot_share": RangeAxis(low=0.0, high=1.0)})
    pts = sample_points(spec)
    assert len(pts) == n
    for key, low, high in (("offload", lo, lo + width), ("knobs.hot_share", 0.0, 1.0)):
        u = (np.array([p[key] for p in pts]) - low) / (high - low)
        assert np.all((u >= -1e-9) & (u <= 1 + 1e-9))
        strata = np.minimum((u * n).astype(int), n - 1)
        assert sorted(strata.tolist()) == list(range(n))
    assert sample_points(spec) == pts  # seeded


def test_sampling_sizes_integers_logs_and_choices():
    spec = SampleSpec(method="random", n=50, seed=3, ranges={
        "memory_budget": RangeAxis(low="302MB", high="310MB"),
        "knobs.cluster_neurons": RangeAxis(low=64, high=4096, log=True, integer=True),
        "knobs.policy": RangeAxis(choices=["lru", "s3fifo"])})
    pts = sample_points(spec)
    budgets = [p["memory_budget"] for p in pts]
    assert all(isinstance(b, int) and 302_000_000 <= b <= 310_000_000 for b in budgets)
    sizes = np.array([p["knobs.cluster_neurons"] for p in pts])
    assert sizes.dtype.kind == "i" and sizes.min() >= 64 and sizes.max() <= 4096
    assert np.median(sizes) < (64 + 4096) / 2  # log-uniform leans low
    assert {p["knobs.policy"] for p in pts} == {"lru", "s3fifo"}


def test_apply_path_errors_name_the_place():
    data = load_device("oneplus-12").model_dump(mode="json")
    with pytest.raises(SimError, match="no entry named 'huge'"):
        apply_path(data, "cpu.clusters.huge.cores", 2, where="device.cpu.clusters.huge.cores")
    with pytest.raises(SimError, match="out of range"):
        apply_path(data, "cpu.clusters.9.cores", 2)
    with pytest.raises(SimError, match="non-numeric"):
        apply_path(data, "storage.type", 2.0, scale=True)
