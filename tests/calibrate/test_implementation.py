"""A run may say whose implementation of its strategy it is (``implementation``), so that the
values the calibration scopes to that implementation reach it: [PI2]'s port of LLM in a Flash
is not Apple's program, and Fig. 10's comparison needs the port."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.calibrate.apply import calibrated_config
from sim.calibrate.calibration import load_calibration
from sim.calibrate.unknowns import known_implementations, load_unknowns
from sim.cli import main
from sim.engine.config import RunConfig
from sim.engine.strategies import REGISTRY
from sim.explore.resolve import resolve_settings, run_config
from sim.profiles.device import DeviceProfile
from sim.profiles.model import ModelProfile

# an implementation the registry scopes values to (today [PI2]'s port), and its strategy
PORT = sorted(u.scope["implementation"] for u in load_unknowns() if "/" in u.scope.get("implementation", ""))[0]
STRATEGY = PORT.split("/")[0]


def strategy_names() -> list[str]:
    return sorted(REGISTRY)


def _port_knob_unknowns():
    return {u.field_path: u for u in load_unknowns()
            if u.scope.get("implementation") == PORT and u.kind == "knobs"}


def test_the_implementations_a_run_may_name_are_the_registry_scopes():
    assert known_implementations(STRATEGY)[0] == STRATEGY
    assert PORT in known_implementations(STRATEGY)
    others = [name for name in strategy_names() if not any(i.startswith(f"{name}/") for i in
                                                           known_implementations(name))]
    assert others and all(known_implementations(name) == (name,) for name in others)


def test_an_implementation_nothing_is_calibrated_for_is_one_line_and_exit_2(capsys):
    assert main(["run", "--strategy", STRATEGY, "--implementation", f"{STRATEGY}/mine",
                 "--decode-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--implementation" in err and PORT in err and len(err.splitlines()) == 1
    other = next(name for name in strategy_names() if name != STRATEGY)
    assert main(["run", "--strategy", other, "--implementation", PORT, "--decode-tokens", "2"]) == 2
    assert "--implementation" in capsys.readouterr().err


def test_the_ports_values_reach_a_run_that_names_it_and_no_other():
    cal = load_calibration(None)
    knobs = _port_knob_unknowns()
    assert knobs, "the registry scopes knobs to the port"
    base = dict(strategy=STRATEGY, memory_budget="19GB", decode_tokens=2)
    port = calibrated_config(RunConfig.of(**base, implementation=PORT), cal)
    apple = calibrated_config(RunConfig.of(**base), cal)
    for path, unknown in knobs.items():
        value = cal.values[unknown.name]
        assert port.knobs[path] == (round(value) if unknown.integer else value)
        assert path not in apple.knobs
    # a knob the user sets stays theirs
    mine = calibrated_config(RunConfig.of(**base, implementation=PORT, knobs={"readers": 3}), cal,
                             user_paths=("readers",))
    assert mine.knobs["readers"] == 3


def test_a_sweep_point_with_every_knob_filled_in_still_gets_the_ports_values(tmp_path: Path):
    """A sweep resolves every knob to its default; a default is not the user's choice, so the
    calibrated value replaces it, while a knob the point sets keeps its value."""
    cal = load_calibration(None)
    knobs = _port_knob_unknowns()
    settings = {"strategy": STRATEGY, "implementation": PORT, "memory_budget": "19GB", "decode_tokens": 2,
                "knobs.readers": 3}
    task = resolve_settings(settings)
    config = run_config(task, DeviceProfile.model_validate(task["device"]), ModelProfile.model_validate(task["model"]))
    assert config.implementation == PORT
    got = calibrated_config(config, cal, user_paths=tuple(task["calibration"]["user_paths"]))
    assert got.knobs["readers"] == 3
    for path, unknown in knobs.items():
        if path != "readers":
            value = cal.values[unknown.name]
            assert got.knobs[path] == pytest.approx(round(value) if unknown.integer else value)


def test_a_run_without_an_implementation_keeps_its_id():
    """The option is new: a run that does not name one hashes as before (sweeps resume)."""
    plain = RunConfig.of(strategy=STRATEGY)
    assert "implementation" not in plain.canonical()
    assert RunConfig.of(strategy=STRATEGY, implementation=PORT).run_id() != plain.run_id()
