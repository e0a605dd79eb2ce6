"""The names `sim` exports resolve, and the documented one-liner runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

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


def test_profile_objects_are_checked_like_files():
    """An edited profile object (model_copy skips pydantic's checks) fails in one line, not in the engine."""
    device = sim.load_device("oneplus-12")
    curve = list(device.storage.rand_read)
    curve[0] = curve[0].model_copy(update={"gbps": float("nan")})
    broken = device.model_copy(update={"storage": device.storage.model_copy(update={"rand_read": curve})})
    for call in (lambda: sim.simulate(broken, "turbosparse-mistral-7b", offload=0.5, decode_tokens=2),
                 lambda: sim.plan_memory("turbosparse-mistral-7b", broken, offload=0.5)):
        try:
            call()
        except sim.SimError as exc:
            assert "storage.rand_read.0.gbps" in str(exc) and "\n" not in str(exc)
        else:
            raise AssertionError("a NaN bandwidth was accepted")
    assert sim.load_device(device) == device  # an intact object passes unchanged
    for call, text in ((lambda: sim.load_model(device), "expected a ModelProfile"),
                       (lambda: sim.load_device(5), "expected a device name")):
        try:
            call()
        except sim.SimError as exc:
            assert text in str(exc)
        else:
            raise AssertionError(text)


def test_check_options_refuses_policies_the_run_would_refuse():
    """So a sweep stops before running a point whose policy cannot serve its strategy."""
    cases = [({"policy": "belady"}, "--policy", "needs the future"),
             ({"strategy": "llm-in-flash", "policy": "static-hot"}, "--policy", "profile"),
             ({"knobs": {"policy": "bogus"}}, "knobs.policy", "unknown policy"),
             ({"knobs": "cluster_neurons=512"}, "knobs", "mapping"),
             ({"strategy": ["powerinfer2"]}, "--strategy", "strategy name"),
             ({"offload": True}, "--offload", "fraction")]
    for kwargs, field, text in cases:
        kw = {"offload": 0.5, **kwargs}
        try:
            sim.check_options("oneplus-12", "turbosparse-mistral-7b", **kw)
        except sim.SimError as exc:
            assert exc.field == field and text in str(exc), (kwargs, exc)
        else:
            raise AssertionError(f"accepted {kwargs}")
    sim.check_options("oneplus-12", "turbosparse-mistral-7b", "powerinfer2", offload=0.5, policy="static-hot")


def test_plan_memory_takes_names_and_checks_its_arguments():
    by_name = sim.plan_memory("turbosparse-mistral-7b", "oneplus-12", offload=0.5)
    by_object = sim.plan_memory(sim.load_model("turbosparse-mistral-7b"), sim.load_device("oneplus-12"), offload=0.5)
    assert by_name == by_object
    for kwargs, field in (({"weights_dtype": "INT4"}, "--weights-dtype"), ({"offload": "0.5"}, "--offload"),
                          ({"context_tokens": 1.5}, "--context-tokens"),
                          ({"runtime_bytes": float("nan")}, "runtime_bytes")):
        try:
            sim.plan_memory("turbosparse-mistral-7b", "oneplus-12", **kwargs)
        except sim.SimError as exc:
            assert exc.field == field, (kwargs, exc)
        else:
            raise AssertionError(f"accepted {kwargs}")


def test_validate_keeps_its_columns_and_reads_one_id_as_one_id():
    one = sim.validate("pi2-mixtral-7gb-mem-cache", decode_tokens=1)
    assert len(one) == 1 and one["status"].tolist() == ["ok"]
    assert {"error", "error_pct", "status"} <= set(one.columns)  # present even when no row failed
    for kwargs in ({"ids": []}, {"ids": [1]}, {"on_error": "bogus"}):
        try:
            sim.validate(**{"decode_tokens": 1, **kwargs})
        except sim.SimError:
            pass
        else:
            raise AssertionError(f"accepted {kwargs}")


def test_analytic_mode_has_no_timeline():
    try:
        sim.simulate("oneplus-12", "turbosparse-mistral-7b", offload=0.5, decode_tokens=2, mode="analytic",
                     timeline=True)
    except sim.SimError as exc:
        assert exc.field == "--timeline"
    else:
        raise AssertionError("an analytic run returned an empty timeline")


def test_a_saturated_unit_is_at_most_fully_busy():
    """Busy seconds are sums of float intervals; a saturated core read 1.000000000000002 before the clip.

    In memory the decode is compute-bound whatever the trace's locality, so a compute core saturates."""
    result = sim.simulate("oneplus-12", "turbosparse-mistral-7b", offload=0.0, decode_tokens=3, prompt_tokens=8,
                          warmup_tokens=2)
    busy = result.summary["utilisation"]
    assert busy and all(0.0 <= v <= 1.0 for v in busy.values()) and max(busy.values()) > 0.99


def test_api_arguments_of_the_wrong_kind_are_sim_errors_naming_them():
    """Each once escaped as a TypeError or AttributeError from deep inside, ran something
    else than asked (a string iterated as budgets), or buried the message under a long repr."""
    from sim.explore.store import read_results
    from sim.studies import budget_sweep

    device = sim.load_device("oneplus-12")
    cases = [
        (lambda: sim.simulate(trace=5), "--trace: expected a trace file path or a Trace, got int"),
        (lambda: sim.simulate(trace=sim.Trace(None)), "--trace: the Trace has no metadata"),
        (lambda: sim.simulate(preset=""), "--preset: expected a preset name, got ''"),
        (lambda: sim.simulate(timeline="no"), "--timeline: must be True or False"),
        (lambda: sim.check_options(policy=device), "--policy: unknown policy DeviceProfile("),
        (lambda: sim.check_options(memory_budget="1e400GB"), "--memory-budget: is too large for a size"),
        (lambda: sim.plan_memory("turbosparse-mistral-7b", "oneplus-12", predictor="no"), "predictor: must be True"),
        (lambda: sim.plan_memory("turbosparse-mistral-7b", "oneplus-12", runtime_bytes=1.5), "runtime_bytes: must be"),
        (lambda: sim.plan_memory("turbosparse-mistral-7b", "oneplus-12", budget=True), "--memory-budget: expected"),
        (lambda: budget_sweep("7GB"), "budgets: expected a list of budgets"),
        (lambda: read_results(None), "path: expected a results file path"),
    ]
    for call, message in cases:
        with pytest.raises(sim.SimError) as info:
            call()
        assert message in str(info.value) and len(str(info.value)) < 300, str(info.value)
