"""sim/traces/fit.py: fit -> synth -> stats reproduces the source trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.traces.fit import drift_variance_kept, fit_params, write_params
from sim.traces.fit_drift import fit_drift
from sim.traces.format import Trace
from sim.traces.params import SynthDims, load_params, params_from_mapping
from sim.traces.stats import K_MAX, POPULARITY_PERCENTS, trace_stats
from sim.traces.synth import TraceSynthesizer, synth_trace, synthesize

SHIPPED = Path(__file__).resolve().parents[2] / "traces" / "minilm-l6-v2.npz"


@pytest.fixture(scope="module")
def shipped():
    if not SHIPPED.is_file():
        pytest.skip("the shipped MiniLM trace is not present")
    trace = Trace.load(SHIPPED).materialise()
    return trace, trace_stats(trace)


def test_fit_synth_stats_round_trip_on_the_shipped_real_trace(shipped, tmp_path):
    trace, src = shipped
    raw = fit_params(trace, stats=src)
    params = load_params(write_params(raw, tmp_path / "p.yaml"))
    assert params.made_for is not None and params.made_for.n_neurons == trace.meta.n_neurons
    syn = trace_stats(synth_trace(params, params.made_for, 1500, seed=1))
    np.testing.assert_allclose(syn["density"], src["density"], rtol=0.02)
    # with drift the long-run popularity depends on the trace's length: compare at the source's
    n = trace.meta.n_tokens
    same_length = [trace_stats(synth_trace(params, params.made_for, n, seed=s))["popularity"] for s in range(2, 6)]
    for x in POPULARITY_PERCENTS:
        got = np.mean([pop[x] for pop in same_length])
        assert abs(got / src["popularity"][x] - 1) < 0.10, x
    for k in range(K_MAX + 1):
        assert abs(syn["window_new_share"][k] / src["window_new_share"][k] - 1) < 0.10, k
    assert abs(syn["predicted"]["recall_mean"] - src["predicted"]["recall_mean"]) < 0.02
    assert abs(syn["predicted"]["precision_mean"] - src["predicted"]["precision_mean"]) < 0.02


def test_fitted_params_transfer_to_a_wider_deeper_moe(shipped):
    trace, src = shipped
    params = params_from_mapping(fit_params(trace, stats=src))
    dims = SynthDims(n_layers=12, n_neurons=4096, hidden=64, n_experts=4, top_k=2, model="wide")
    gen = TraceSynthesizer(params, dims, seed=0)
    for _ in synthesize(params, dims, 40, synthesizer=gen):
        pass
    # 6 fitted layers are spread over 12 by relative depth: first and last layers keep their density
    assert gen.target_density[0] == pytest.approx(src["density"][0], rel=1e-4)
    assert gen.target_density[-1] == pytest.approx(src["density"][-1], rel=1e-4)
    np.testing.assert_allclose(gen.realised_density(), gen.target_density, rtol=0.1)


def test_fit_recovers_moe_routing_and_persistence():
    truth = {"name": "truth", "density": {"value": 0.12}, "propensity": {"dist": "logitnormal", "sigma": 2.0},
             "persistence": {"value": 0.6},
             "routing": {"popularity": [0.35, 0.3, 0.2, 0.15], "persistence": 0.4}}
    dims = SynthDims(2, 800, 16, 4, 2)
    trace = synth_trace(params_from_mapping(truth), dims, 1500, seed=3).materialise()
    raw = fit_params(trace)
    np.testing.assert_allclose(raw["routing"]["popularity"], [[0.35, 0.3, 0.2, 0.15]] * 2, atol=0.02)
    np.testing.assert_allclose(raw["routing"]["persistence"], 0.4, atol=0.05)
    np.testing.assert_allclose(raw["persistence"]["value"], 0.6, atol=0.05)
    np.testing.assert_allclose(raw["density"]["value"], 0.12, rtol=0.02)


def _drifting(drift, seed=3, moe=False):
    raw = {"name": "d", "density": {"value": 0.1}, "propensity": {"dist": "logitnormal", "sigma": 3.0},
           "persistence": {"value": 0.7}, "drift": drift}
    if moe:
        raw["routing"] = {"popularity": "uniform", "persistence": 0.2}
    dims = SynthDims(4, 800, 16, 4, 2) if moe else SynthDims(4, 800, 16)
    params = params_from_mapping(raw)
    shifts = TraceSynthesizer(params, dims, seed).drift_tokens(1000).size
    return synth_trace(params, dims, 1000, seed=seed).materialise(), shifts


@pytest.mark.parametrize("moe", [False, True])
def test_fit_drift_recovers_the_decay_and_tells_big_shifts_from_small_ones(moe):
    still, _ = _drifting({"rate": 0.0}, moe=moe)
    fit = fit_drift(still, refresh=0.3)
    assert not fit["significant"] and fit["rate"] == 0.0
    big, n_big = _drifting({"rate": 0.02, "share": 0.5}, moe=moe)
    small, n_small = _drifting({"rate": 0.1, "share": 0.1}, moe=moe)
    fb, fs = fit_drift(big, refresh=0.3), fit_drift(small, refresh=0.3)
    assert fb["significant"] and fs["significant"]
    # the decay measures the shifts that happened: (number / tokens) x share
    assert fb["decay_per_token"] == pytest.approx(n_big / 1000 * 0.5, rel=0.3)
    assert fs["decay_per_token"] == pytest.approx(n_small / 1000 * 0.1, rel=0.3)
    assert 0.3 < fb["share"] < 0.75 and fs["share"] < 0.25  # few big shifts against many small ones
    assert fb["n_events"] > 0.5 * n_big and fs["n_events"] == 0  # big shifts are visible one by one


def test_drift_variance_kept_matches_a_simulated_time_average():
    rng = np.random.default_rng(0)
    rate, n_tok, n = 0.01, 300, 4000
    values = rng.standard_normal(n)
    total = np.zeros(n)
    for _ in range(n_tok):
        total += values
        redraw = rng.random(n) < rate
        values[redraw] = rng.standard_normal(int(redraw.sum()))
    kept = drift_variance_kept(rate, n_tok)
    assert drift_variance_kept(0.0, n_tok) == 1.0 and 0 < kept < 1
    assert np.var(total / n_tok) == pytest.approx(kept, rel=0.1)


def test_fit_params_writes_a_loadable_drift_group():
    trace, _ = _drifting({"rate": 0.02, "share": 0.5})
    raw = fit_params(trace)
    assert raw["drift"]["rate"] > 0 and 0 < raw["drift"]["share"] <= 1 and "fitted" in raw["drift"]
    assert params_from_mapping(raw).drift(SynthDims(4, 800, 16))[0] == raw["drift"]["rate"]
    assert "drift" not in fit_params(trace, drift=False)
