"""`sim strategies`: every knob a user can `--set` is listed with its type, default and meaning."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.engine.strategies import REGISTRY, get_strategy


def test_every_knob_of_every_strategy_says_what_it_means():
    get_strategy("powerinfer2")  # registers the bundled strategies
    for name, cls in REGISTRY.items():
        for knob, field in cls.knobs_model.model_fields.items():
            assert field.description and len(field.description) > 10, f"{name}.{knob} has no description"


def test_the_list_names_each_strategy_and_its_knobs(capsys):
    assert main(["strategies", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"powerinfer2", "llm-in-flash", "llamacpp", "dense"}
    for name, row in rows.items():
        assert row["knobs"] == list(get_strategy(name).knobs_model.model_fields)


def test_a_strategys_knobs_carry_their_types_and_the_defaults_a_run_uses(capsys):
    assert main(["strategies", "powerinfer2", "--json"]) == 0
    rows = {r["knob"]: r for r in json.loads(capsys.readouterr().out)}
    defaults = get_strategy("powerinfer2").knobs_model()
    for knob, row in rows.items():
        assert row["default"] == getattr(defaults, knob), knob
    assert rows["cluster_neurons"]["type"] == "int"
    assert rows["compute_cores"]["type"] == "list[str] | null"
    assert rows["hot_unit"]["type"] == "npu|gpu | null"


def test_the_table_prints_bracketed_types_and_yaml_defaults(capsys):
    assert main(["strategies", "llm-in-flash"]) == 0
    out = capsys.readouterr().out
    assert "list[str]" in out and "[FLASH" in out  # not swallowed as rich markup
    assert "true" in out and "True" not in out


@pytest.mark.parametrize("args", [["strategies", "warp-drive"], ["strategies", "warp-drive", "--json"]])
def test_an_unknown_strategy_is_one_line_naming_the_argument(capsys, args):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: NAME: unknown strategy 'warp-drive'") and "\n" not in err


def test_placing_the_io_thread_gives_its_default_core_back_to_compute():
    """--set io_cores=[efficiency] left a performance core idle: the compute default still
    kept it for the I/O thread that had moved."""
    import sim

    run = {"model": "turbosparse-mistral-7b", "offload": 0.5}
    default = sim.check_options("iphone-15-pro", **run)
    # beside the I/O thread one performance core computes less than the four efficiency cores
    # together, so they compute too (issue 18: 10.1 tokens/s on the one core, 17.0 with them)
    assert default.compute_cores == ["performance"] + ["efficiency"] * 4 and default.io_cores == ["performance"]
    moved = sim.check_options("iphone-15-pro", **run, knobs={"io_cores": ["efficiency"]})
    assert moved.compute_cores == ["performance", "performance"] and moved.io_cores == ["efficiency"]
    both = sim.check_options("iphone-15-pro", **run, knobs={"io_cores": ["efficiency"],
                                                          "compute_cores": ["performance"]})
    assert both.compute_cores == ["performance"]  # what the user gives is kept
    flash = sim.check_options("iphone-15-pro", strategy="llm-in-flash", **run, knobs={"io_cores": ["efficiency"]})
    assert flash.compute_cores == sim.check_options("iphone-15-pro", strategy="llm-in-flash", **run).compute_cores
