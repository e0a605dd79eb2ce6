"""sim/traces/fit.py: fit -> synth -> stats reproduces the source trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.traces.fit import fit_params, write_params
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
    for x in POPULARITY_PERCENTS:
        assert abs(syn["popularity"][x] / src["popularity"][x] - 1) < 0.10, x
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
