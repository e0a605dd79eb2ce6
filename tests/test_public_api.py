"""The names `sim` exports resolve, and the documented one-liner runs."""

from __future__ import annotations

import subprocess
import sys

import sim


def test_every_public_name_resolves():
    for name in sim.__all__:
        assert getattr(sim, name) is not None, name


def test_import_sim_is_cheap():
    code = "import sys, sim; print('simpy' in sys.modules, 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_unknown_name_is_an_attribute_error():
    try:
        sim.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_documented_example_runs_and_is_the_engine():
    from sim.engine.simulation import simulate

    assert sim.simulate is simulate
    device = sim.load_device("oneplus-12")
    result = sim.simulate(device, "turbosparse-mistral-7b", "powerinfer2", offload=0.5, decode_tokens=2,
                          warmup_tokens=1, profile_tokens=4, mode="analytic")
    assert result.summary["decode_tokens_per_s"] > 0
    assert result.summary["memory"]["ffn_resident_fraction"] == 0.5
