"""sim/traces/synth.py: determinism, streaming = file, configured statistics are realised."""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import SimError
from sim.traces.format import Trace, check_chunk
from sim.traces.params import SynthDims, load_preset, params_from_mapping
from sim.traces.stats import trace_stats
from sim.traces.synth import TraceSynthesizer, solve_propensities, synth_trace, synthesize, write_synthetic

BASE = {"name": "t", "density": {"value": [0.05, 0.2]}, "propensity": {"dist": "logitnormal", "sigma": 1.5},
        "persistence": {"value": [0.3, 0.7]}, "predictor": {"recall": 0.9, "precision": 0.6}}
MOE = {**BASE, "routing": {"popularity": [0.4, 0.3, 0.2, 0.1], "persistence": [0.2, 0.6]}}


def _params(raw=BASE, **changes):
    raw = {**raw, **changes}
    return params_from_mapping(raw)


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _flat(chunks):
    """Concatenate chunks into per-row lists, independent of how tokens were chunked."""
    rows, pred, experts = [], [], []
    for c in chunks:
        rows += [c.ids[c.offsets[r]:c.offsets[r + 1]] for r in range(c.offsets.size - 1)]
        if c.pred_offsets is not None:
            pred += [c.pred_ids[c.pred_offsets[r]:c.pred_offsets[r + 1]] for r in range(c.pred_offsets.size - 1)]
        experts.append(c.experts)
    return rows, pred, np.concatenate(experts)


def test_same_seed_identical_and_other_seed_differs():
    dims = SynthDims(2, 300, 16, 4, 2)
    a = _flat(synthesize(_params(MOE), dims, 50, seed=7))
    b = _flat(synthesize(_params(MOE), dims, 50, seed=7))
    c = _flat(synthesize(_params(MOE), dims, 50, seed=8))
    assert _same(a[0], b[0]) and _same(a[1], b[1]) and np.array_equal(a[2], b[2])
    assert not _same(a[0], c[0])


def test_chunking_does_not_change_the_trace():
    dims = SynthDims(2, 300, 16, 4, 2)
    a = _flat(synthesize(_params(MOE), dims, 45, seed=3, chunk_tokens=64))
    b = _flat(synthesize(_params(MOE), dims, 45, seed=3, chunk_tokens=7))
    assert _same(a[0], b[0]) and _same(a[1], b[1]) and np.array_equal(a[2], b[2])


def test_on_the_fly_trace_equals_the_saved_file(tmp_path):
    dims = SynthDims(3, 500, 16, 4, 2)
    params = _params(MOE)
    live = synth_trace(params, dims, 70, seed=11, chunk_tokens=16)
    path, _ = write_synthetic(tmp_path / "t.npz", params, dims, 70, seed=11, chunk_tokens=16)
    saved = Trace.load(path)
    assert live.meta == saved.meta
    for _ in range(2):  # a lazy trace regenerates identically each time it is read
        for x, y in zip(live.chunks(), saved.chunks(), strict=True):
            check_chunk(x, live.meta)
            for name in ("offsets", "ids", "experts", "pred_offsets", "pred_ids"):
                assert np.array_equal(getattr(x, name), getattr(y, name)), name
    assert np.array_equal(live.active(33, 1, 1), saved.active(33, 1, 1))


def test_realised_density_matches_target():
    dims = SynthDims(2, 2000, 16)
    gen = TraceSynthesizer(_params(), dims, seed=1)
    for _ in synthesize(gen.params, dims, 600, synthesizer=gen):
        pass
    assert np.allclose(gen.target_density, [0.05, 0.2])
    np.testing.assert_allclose(gen.realised_density(), gen.target_density, rtol=0.03)


def test_propensities_hit_density_exactly_and_are_skewed():
    shape = load_preset("opt-6.7b").propensity_shape(SynthDims(1, 4096, 16))[0]
    p = solve_propensities(shape, 0.033)
    assert abs(p.mean() - 0.033) < 1e-12 and p.max() <= 1.0
    assert np.sort(p)[-41:].sum() / p.sum() > 0.05  # top 1% carry > 5x their share


def test_window_curve_and_predictor_follow_the_model():
    dims = SynthDims(1, 3000, 16)
    raw = {**BASE, "density": {"value": 0.1}, "persistence": {"value": 0.5}}
    s = trace_stats(synth_trace(_params(raw), dims, 800, seed=2))
    gen = TraceSynthesizer(_params(raw), dims, seed=2)
    p = gen.tables.p_by_id[0, 0].astype(np.float64)
    r = 0.5
    for k in (1, 2, 5, 10):
        expected = float((p * r * (1 - p) * (1 - r * p) ** (k - 1)).mean())
        assert abs(s["window_new_share"][k] / expected - 1) < 0.04, k
    assert abs(s["predicted"]["recall_mean"] - 0.9) < 0.01
    assert abs(s["predicted"]["precision_mean"] - 0.6) < 0.01


def test_moe_routing_shares_and_persistence_as_configured():
    dims = SynthDims(2, 64, 16, 4, 2)
    s = trace_stats(synth_trace(_params(MOE), dims, 4000, seed=5))
    np.testing.assert_allclose(s["experts"]["popularity"], [[0.4, 0.3, 0.2, 0.1]] * 2, atol=0.02)
    base = ((2 * np.array([0.4, 0.3, 0.2, 0.1])) ** 2).sum() / 2
    for layer, rho in enumerate((0.2, 0.6)):
        assert abs(s["experts"]["persistence"][layer] - (rho + (1 - rho) * base)) < 0.02
    assert abs(s["density"][0] - 0.05) < 0.005 and abs(s["density"][1] - 0.2) < 0.01


def test_coactivation_groups_correlate_members_without_moving_density():
    dims = SynthDims(1, 1000, 16)
    raw = {**BASE, "density": {"value": 0.1}, "persistence": {"value": 0.0},
           "coactivation": {"group_size": 4, "strength": 0.9}}
    gen = TraceSynthesizer(_params(raw), dims, seed=4, predictions=False)
    act = np.zeros((1500, 1000), bool)
    for ch in synthesize(gen.params, dims, 1500, synthesizer=gen):
        for i in range(ch.n_tokens):
            act[ch.start + i, ch.active(ch.start + i, 0)] = True
    assert abs(act.mean() - 0.1) < 0.004
    groups = gen.tables.group_of_id[0, 0]
    order = np.argsort(groups, kind="stable")
    a, b = act[:, order[0::4]], act[:, order[1::4]]  # first two members of every group
    c = act[:, np.roll(order[1::4], 7)]  # members of other groups
    # joint activity against independence given each neuron's own frequency
    together = (a & b).mean() / (a.mean(0) * b.mean(0)).mean()
    apart = (a & c).mean() / (a.mean(0) * c.mean(0)).mean()
    assert together > 1.5 and abs(apart - 1) < 0.2


def test_params_scale_to_other_widths_and_depths():
    params = load_preset("turbosparse-mixtral-47b")
    dims = SynthDims(3, 256, 32, 4, 2)  # fewer layers, experts and neurons than made for
    gen = TraceSynthesizer(params, dims, seed=0)
    for ch in synthesize(params, dims, 20, synthesizer=gen):
        check_chunk(ch, gen.meta(20, 64))
    assert gen.realised_density().shape == (3,)


@pytest.mark.parametrize("change, field", [
    ({"density": {"value": 1.5}}, "density.value"),
    ({"predictor": {"recall": 0.9}}, "predictor"),
    ({"propensity": {"dist": "zipf"}}, "propensity.dist"),
    ({"routing": {"popularity": [0.9, 0.05, 0.03, 0.02]}}, "routing.popularity"),
    ({"persistence": {"value": [0.1, "x"]}}, "persistence.value"),
    ({"bogus": 1}, None),
])
def test_bad_parameters_are_one_line_errors(change, field):
    with pytest.raises(SimError) as info:
        params = _params(MOE, **change)
        TraceSynthesizer(params, SynthDims(2, 32, 8, 4, 2))
    assert "\n" not in str(info.value)
    if field:
        assert info.value.field == field


def test_buffer_overflow_growth_gives_the_same_trace(monkeypatch):
    import sim.traces.synth as synth_module

    dims = SynthDims(2, 300, 16, 4, 2)
    normal = _flat(synthesize(_params(MOE), dims, 30, seed=6, chunk_tokens=8))
    monkeypatch.setattr(synth_module, "_BUFFER_FACTOR", 0.001)  # every chunk outgrows its first buffers
    grown = _flat(synthesize(_params(MOE), dims, 30, seed=6, chunk_tokens=8))
    assert _same(normal[0], grown[0]) and _same(normal[1], grown[1]) and np.array_equal(normal[2], grown[2])


# -- context shifts (drift) ---------------------------------------------------------------------

DRIFT = {**BASE, "density": {"value": 0.1}, "persistence": {"value": 0.8},
         "propensity": {"dist": "logitnormal", "sigma": 3.0}, "drift": {"rate": 0.05, "share": 0.5}}


def _activity(params, dims, n_tokens, seed, chunk_tokens=64):
    """(tokens, layers, experts * neurons) bool activity of a small trace."""
    act = np.zeros((n_tokens, dims.n_layers, dims.n_experts * dims.n_neurons), bool)
    for ch in synthesize(params, dims, n_tokens, seed, chunk_tokens=chunk_tokens):
        for i in range(ch.n_tokens):
            for layer in range(dims.n_layers):
                for slot in range(dims.top_k):
                    e = int(ch.experts[i, layer, slot])
                    act[ch.start + i, layer, e * dims.n_neurons + ch.active(ch.start + i, layer, slot)] = True
    return act


@pytest.mark.parametrize("extra", [{}, {"coactivation": {"group_size": 4, "strength": 0.8}}])
def test_drift_is_deterministic_and_chunking_invariant(extra):
    dims = SynthDims(2, 300, 16, 4, 2)
    params = _params({**MOE, **extra, "drift": {"rate": 0.1, "share": [0.3, 0.6], "static": 0.3}})
    assert TraceSynthesizer(params, dims, seed=3).drift_tokens(45).size >= 2  # shifts happen in the range
    a = _flat(synthesize(params, dims, 45, seed=3, chunk_tokens=64))
    b = _flat(synthesize(params, dims, 45, seed=3, chunk_tokens=7))
    c = _flat(synthesize(params, dims, 45, seed=3, chunk_tokens=64))
    assert _same(a[0], b[0]) and _same(a[1], b[1]) and np.array_equal(a[2], b[2])
    assert _same(a[0], c[0]) and _same(a[1], c[1])


def test_drift_on_the_fly_equals_file_and_survives_buffer_retries(tmp_path, monkeypatch):
    import sim.traces.synth as synth_module

    dims = SynthDims(2, 400, 16, 4, 2)
    params = _params({**MOE, "drift": {"rate": 0.15, "share": 0.5}})
    live = synth_trace(params, dims, 40, seed=5, chunk_tokens=8)
    path, _ = write_synthetic(tmp_path / "d.npz", params, dims, 40, seed=5, chunk_tokens=8)
    normal = _flat(live.chunks())
    assert _same(normal[0], _flat(Trace.load(path).chunks())[0])
    monkeypatch.setattr(synth_module, "_BUFFER_FACTOR", 0.001)  # retries must restore the shifted tables
    retried = _flat(synthesize(params, dims, 40, seed=5, chunk_tokens=8))
    assert _same(normal[0], retried[0]) and _same(normal[1], retried[1])


def test_drift_rate_zero_is_the_old_generator_and_tokens_before_the_first_shift_are_unchanged():
    dims = SynthDims(2, 300, 16, 4, 2)
    plain = _flat(synthesize(_params(MOE), dims, 60, seed=2))
    off = _flat(synthesize(_params({**MOE, "drift": {"rate": 0.0, "share": 0.7}}), dims, 60, seed=2))
    no_share = _flat(synthesize(_params({**MOE, "drift": {"rate": 0.3, "share": 0.0}}), dims, 60, seed=2))
    assert _same(plain[0], off[0]) and _same(plain[1], off[1]) and _same(plain[0], no_share[0])
    params = _params({**MOE, "drift": {"rate": 0.05, "share": 0.5}})
    first = int(TraceSynthesizer(params, dims, seed=2).drift_tokens(60)[0])
    drifted = _flat(synthesize(params, dims, 60, seed=2))
    rows = first * dims.n_layers * dims.top_k
    assert _same(plain[0][:rows], drifted[0][:rows])  # identical up to the first shift ...
    assert not _same(plain[0][rows:], drifted[0][rows:])  # ... and not after it
    assert np.array_equal(plain[2], drifted[2])  # drift never touches routing


def test_drift_keeps_density_and_makes_a_static_hot_set_go_stale():
    dims = SynthDims(1, 1000, 16)
    still = _activity(_params(DRIFT, drift={"rate": 0.0}), dims, 700, seed=1)
    moving = _activity(_params(DRIFT), dims, 700, seed=1)
    assert abs(moving.mean() - 0.1) < 0.01 and abs(still.mean() - 0.1) < 0.01

    def coverage_decay(act):
        hot = np.argsort(-act[:50, 0].sum(0))[:100]  # the 100 most active neurons of the first 50 tokens
        near, far = act[50:60, 0], act[600:700, 0]
        return near[:, hot].sum() / near.sum(), far[:, hot].sum() / far.sum()

    s_near, s_far = coverage_decay(still)
    m_near, m_far = coverage_decay(moving)
    assert s_near > 0.5 and abs(s_far - s_near) < 0.05  # no drift: the set still covers token 600+
    assert m_far < 0.15 and m_near > m_far + 0.1  # drift: it has gone stale, down to a random set's 10%
    # a shift replaces the hot set at once: the next token's coverage by the previous token's set drops
    shifts = TraceSynthesizer(_params(DRIFT), dims, seed=1).drift_tokens(700)
    overlap = (moving[1:, 0] & moving[:-1, 0]).sum(1) / moving[1:, 0].sum(1)
    at_shift = overlap[shifts[shifts > 0] - 1]
    assert at_shift.mean() < np.delete(overlap, shifts[shifts > 0] - 1).mean() - 0.15


def test_regular_spacing_has_one_shift_per_block_and_static_neurons_never_move():
    dims = SynthDims(2, 500, 16, 4, 2)
    regular = _params({**MOE, "drift": {"rate": 0.04, "share": 0.8, "spacing": "regular", "static": 0.5}})
    gen = TraceSynthesizer(regular, dims, seed=9)
    shifts = gen.drift_tokens(1000)
    assert np.array_equal(shifts // 25, np.arange(40))  # exactly one in each block of 1 / rate = 25 tokens
    poisson = TraceSynthesizer(_params({**MOE, "drift": {"rate": 0.04, "share": 0.8}}), dims, seed=9)
    assert np.diff(poisson.drift_tokens(5000)).std() > 2 * np.diff(gen.drift_tokens(5000)).std()
    before = gen.tables.p_by_id.copy()
    for _ in synthesize(regular, dims, 300, synthesizer=gen):
        pass
    after = gen.tables.p_by_id
    assert np.array_equal(np.sort(before, axis=2), np.sort(after, axis=2))  # the same propensities, moved
    for layer in range(dims.n_layers):
        p = np.sort(before[layer, 0])[::-1]
        n_static = int(np.searchsorted(np.cumsum(p) / p.sum(), 0.5)) + 1
        top = before[layer] >= p[n_static - 1]  # the hottest neurons carrying half of the activations
        assert np.array_equal(after[layer][top], before[layer][top])  # ... stay where they were
        assert np.mean(after[layer][~top] != before[layer][~top]) > 0.5  # the others moved


def test_bad_drift_parameters_are_one_line_errors():
    for drift, field in (({"rate": 1.5, "share": 0.5}, "drift.rate"), ({"rate": 0.1}, "drift"),
                         ({"rate": 0.1, "share": 2.0}, "drift.share"), ({"rate": 0.1, "speed": 1}, "drift"),
                         ({"rate": 0.1, "share": 0.5, "spacing": "often"}, "drift.spacing"),
                         ({"rate": 0.1, "share": 0.5, "static": 1.0}, "drift.static"),
                         *(({"rate": 0.1, "share": 0.5, "duration": bad}, "drift.duration")
                           for bad in (-1, 2.5, "4", True, 10_001))):
        with pytest.raises(SimError) as info:
            _params(MOE, drift=drift)
        assert "\n" not in str(info.value) and info.value.field == field
