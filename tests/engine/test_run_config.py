"""RunConfig: one object for a run, whichever entry point builds it (sim/engine/config.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.engine.config import RunConfig, run_options
from sim.engine.simulation import as_config, simulate
from sim.explore import resolve


def test_keyword_and_object_forms_are_one_configuration():
    kw = {"model": "turbosparse-mistral-7b", "offload": 0.5, "decode_tokens": 4, "seed": np.int64(3)}
    cfg = RunConfig(**kw)
    assert as_config(**kw) == cfg == as_config(config=cfg) == as_config(cfg)
    assert as_config("oneplus-12", "turbosparse-mistral-7b", "powerinfer2", offload=0.5, decode_tokens=4,
                     seed=3) == cfg
    assert type(cfg.seed) is int and cfg.knobs == {}


def test_simulate_takes_a_config_and_its_result_carries_the_dump():
    kw = {"model": "turbosparse-mistral-7b", "offload": 0.5, "decode_tokens": 2, "warmup_tokens": 2,
          "prompt_tokens": 4, "mode": "analytic"}
    by_keywords = simulate(**kw)
    by_object = simulate(RunConfig(**kw))
    assert by_object.summary["decode_tokens_per_s"] == by_keywords.summary["decode_tokens_per_s"]
    assert by_object.config == by_keywords.config
    assert set(by_object.config) == {*run_options(), "cores"}
    # the dump is a configuration again, and reruns the same run
    again = {k: v for k, v in by_object.config.items() if k != "cores"}
    assert RunConfig(**again).run_id() == RunConfig(**again).run_id()
    assert simulate(RunConfig(**again)).summary["decode_tokens_per_s"] == by_object.summary["decode_tokens_per_s"]


@settings(max_examples=30, deadline=None)
@given(st.permutations(["offload", "seed", "decode_tokens", "policy"]), st.integers(0, 2**40), st.integers(1, 256))
def test_run_id_is_the_canonical_hash(order, seed, decode):
    values = {"offload": 0.25, "seed": seed, "decode_tokens": decode, "policy": "lru"}
    a = RunConfig(**{k: values[k] for k in order})
    b = RunConfig(**values)
    assert a.run_id() == b.run_id()
    assert RunConfig(**{**values, "seed": seed + 1}).run_id() != a.run_id()


def test_bad_options_are_one_line_errors_naming_them():
    for kwargs, field in (({"decode_tokens": 0}, "--decode-tokens"), ({"mode": "fast"}, "--mode"),
                          ({"seed": -1}, "--seed"), ({"no_such_option": 1}, "no_such_option"),
                          ({"knobs": [1]}, "knobs"), ({"strategy": "nope"}, "--strategy")):
        with pytest.raises(sim.SimError) as err:
            RunConfig.of(**kwargs)
        assert err.value.field == field and "\n" not in str(err.value), (kwargs, err.value)
    with pytest.raises(sim.SimError, match="give a RunConfig or run options, not both"):
        as_config(RunConfig(), offload=0.5)


def test_strategy_rules_live_behind_its_hook():
    assert RunConfig(strategy="dense").offload == 0.0  # dense.check_run: every weight in DRAM
    with pytest.raises(sim.SimError, match="drop --memory-budget/--offload"):
        RunConfig(strategy="dense", offload=0.5)


def test_sweep_settings_are_the_config_fields():
    assert resolve.run_options() == tuple(k for k in run_options() if k not in ("knobs", "overrides"))
    assert resolve.run_defaults()["decode_tokens"] == RunConfig().decode_tokens


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.floats(0.25, 4))
def test_profile_edits_are_part_of_the_configuration_and_its_id(cores_a, cores_b, scale):
    def cfg(cores: int) -> RunConfig:
        return RunConfig(overrides={"device.cpu.clusters.big.cores": cores,
                                    "device.storage.rand_read.*.gbps:scale": scale})

    assert (cfg(cores_a).run_id() == cfg(cores_b).run_id()) == (cores_a == cores_b)
    assert cfg(cores_a).run_id() != RunConfig().run_id()


def test_a_run_with_edits_is_the_run_of_the_edited_profile_and_records_them():
    edits = {"device.cpu.clusters.big.cores": 2, "model.n_layers:scale": 0.5}
    kw = {"model": "turbosparse-mistral-7b", "offload": 0.5, "decode_tokens": 2, "warmup_tokens": 2,
          "prompt_tokens": 4, "mode": "analytic"}
    edited = simulate(RunConfig(**kw, overrides=edits))
    by_objects = simulate(RunConfig(**{**kw, "model": sim.edit_model(kw["model"], {"n_layers:scale": 0.5})},
                                    device=sim.edit_device("oneplus-12", {"cpu.clusters.big.cores": 2})))
    plain = simulate(RunConfig(**kw))
    assert edited.summary["decode_tokens_per_s"] == by_objects.summary["decode_tokens_per_s"]
    assert edited.summary["decode_tokens_per_s"] != plain.summary["decode_tokens_per_s"]
    assert edited.config["overrides"] == edits and plain.config["overrides"] == {}
    assert edited.config["cores"] == by_objects.config["cores"] != plain.config["cores"]


def test_bad_profile_edits_are_one_line_errors_naming_them():
    for overrides in ({"cpu.cores": 1}, {"device.": 1}, ["device.x"]):
        with pytest.raises(sim.SimError) as err:
            RunConfig.of(overrides=overrides)
        assert err.value.field == "overrides" and "\n" not in str(err.value)
    with pytest.raises(sim.SimError, match="no field 'nope'") as err:
        simulate(overrides={"device.nope": 1}, decode_tokens=1, mode="analytic")
    assert err.value.field == "--set device.nope"
