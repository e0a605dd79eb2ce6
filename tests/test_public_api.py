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


def test_check_options_refuses_what_simulate_refuses_without_a_trace(monkeypatch):
    """A configuration can be validated without generating or reading a trace."""
    import sim.engine.simulation as simulation

    def no_trace(*args, **kwargs):
        raise AssertionError("check_options must not touch a trace")

    monkeypatch.setattr(simulation, "resolve_trace", no_trace)
    setup = sim.check_options("oneplus-12", "turbosparse-mistral-7b", "powerinfer2", offload=0.5)
    assert setup.plan.ffn_resident_fraction == 0.5 and setup.io_cores
    for kwargs, field in (({"offload": 0.5, "memory_budget": "8GB"}, "--offload"),
                          ({"weights_dtype": "int3"}, "--weights-dtype"),
                          ({"seed": -1}, "--seed"),
                          ({"prompt_tokens": 40000}, "--prompt-tokens/--decode-tokens"),
                          ({"knobs": {"io_cores": ["no-such-cluster"]}}, "io_cores")):
        try:
            sim.check_options("oneplus-12", "turbosparse-mistral-7b", "powerinfer2", **kwargs)
        except sim.SimError as exc:
            assert exc.field == field, (kwargs, exc)
        else:
            raise AssertionError(f"accepted {kwargs}")


def test_numpy_integers_are_integers():
    """A script looping over ``np.arange`` passes numpy ints; they must run as the same Python ints."""
    import numpy as np

    kw = {"offload": 0.5, "warmup_tokens": 1, "profile_tokens": 4, "mode": "analytic"}
    plain = sim.simulate("oneplus-12", "turbosparse-mistral-7b", "powerinfer2", decode_tokens=2, prompt_tokens=8,
                         seed=1, **kw)
    numpy = sim.simulate("oneplus-12", "turbosparse-mistral-7b", "powerinfer2", decode_tokens=np.int64(2),
                         prompt_tokens=np.int32(8), seed=np.uint8(1), **kw)
    assert numpy.summary["decode_tokens_per_s"] == plain.summary["decode_tokens_per_s"]
    assert numpy.config == plain.config and type(numpy.config["decode_tokens"]) is int
    for bad in (True, 2.0, "2"):
        try:
            sim.simulate("oneplus-12", "turbosparse-mistral-7b", decode_tokens=bad, **kw)
        except sim.SimError as exc:
            assert exc.field == "--decode-tokens"
        else:
            raise AssertionError(f"accepted decode_tokens={bad!r}")
