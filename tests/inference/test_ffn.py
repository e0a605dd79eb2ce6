"""Dense and sparse FFN kernels, activations and MoE routing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import SimError
from sim.inference.ffn import FFN, MoE, activate, active_mask, erf


def _ffn(rng: np.random.Generator, d: int, n: int, activation: str, glu: bool, bias: bool) -> FFN:
    rows = 3 if glu else 2
    bundle = rng.standard_normal((n, rows, d)).astype(np.float32)
    b_in = rng.standard_normal(n).astype(np.float32) if bias else None
    b_out = rng.standard_normal(d).astype(np.float32) if bias else None
    return FFN(bundle, activation, b_in, b_out)


@settings(max_examples=60, deadline=None)
@given(d=st.integers(1, 48), n=st.integers(1, 96), n_tok=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       activation=st.sampled_from(["relu", "drelu"]), glu=st.booleans(), kernel=st.sampled_from(["numba", "numpy"]))
def test_sparse_equals_dense_under_oracle(d, n, n_tok, seed, activation, glu, kernel):
    rng = np.random.default_rng(seed)
    ffn = _ffn(rng, d, n, activation, glu, bias=not glu)
    x = rng.standard_normal((n_tok, d)).astype(np.float32)
    h = ffn.intermediate(x)
    oracle = np.flatnonzero(active_mask(h).any(axis=0))  # one set covering every token
    dense = ffn.dense(x)
    sparse = ffn.sparse(x, oracle, kernel=kernel)
    assert sparse.shape == dense.shape
    assert np.allclose(sparse, dense, rtol=1e-4, atol=1e-4 * (1 + np.abs(dense).max()))
    # single-vector form too
    one = np.flatnonzero(active_mask(h[0]))
    assert np.allclose(ffn.sparse(x[0], one, kernel=kernel), dense[0], rtol=1e-4,
                       atol=1e-4 * (1 + np.abs(dense[0]).max()))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), extra=st.integers(0, 40))
def test_any_superset_of_the_active_set_gives_the_dense_output(seed, extra):
    rng = np.random.default_rng(seed)
    ffn = _ffn(rng, 32, 64, "relu", glu=True, bias=False)
    x = rng.standard_normal(32).astype(np.float32)
    active = active_mask(ffn.intermediate(x[None])[0])
    superset = np.union1d(np.flatnonzero(active), rng.choice(64, size=extra, replace=True))
    assert np.allclose(ffn.sparse(x, superset), ffn.dense(x[None])[0], atol=1e-4)


def test_missing_an_active_neuron_changes_the_output():
    rng = np.random.default_rng(3)
    ffn = _ffn(rng, 16, 40, "relu", glu=True, bias=False)
    x = rng.standard_normal(16).astype(np.float32)
    h = ffn.intermediate(x[None])[0]
    active = np.flatnonzero(h)
    biggest = active[np.argmax(np.abs(h[active]))]
    y = ffn.sparse(x, active[active != biggest])
    assert not np.allclose(y, ffn.dense(x[None])[0], atol=1e-4)


def test_silu_and_gelu_kernels_match_dense_over_all_neurons():
    rng = np.random.default_rng(0)
    for activation, glu in (("silu", True), ("gelu", False), ("gelu_tanh", False)):
        ffn = _ffn(rng, 24, 50, activation, glu, bias=not glu)
        x = rng.standard_normal((3, 24)).astype(np.float32)
        assert np.allclose(ffn.sparse(x, np.arange(50)), ffn.dense(x), atol=1e-4)


def test_bundle_rows_are_gate_up_down_of_one_neuron():
    rng = np.random.default_rng(1)
    gate, up, down = (rng.standard_normal(s).astype(np.float32) for s in ((6, 4), (6, 4), (4, 6)))
    ffn = FFN.from_matrices(up, down, "relu", gate=gate)
    assert ffn.bundle.shape == (6, 3, 4) and ffn.bundle.flags["C_CONTIGUOUS"]
    assert np.array_equal(ffn.bundle[2, 0], gate[2])
    assert np.array_equal(ffn.bundle[2, 1], up[2])
    assert np.array_equal(ffn.bundle[2, 2], down[:, 2])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    ref = (np.maximum(x @ gate.T, 0) * (x @ up.T)) @ down.T
    assert np.allclose(ffn.dense(x), ref, atol=1e-5)


def test_erf_matches_math_erf():
    xs = np.linspace(-6, 6, 2001)
    assert np.max(np.abs(erf(xs) - np.array([math.erf(v) for v in xs]))) < 2e-7


def test_activations_known_values():
    z = np.array([-1.0, 0.0, 2.0], dtype=np.float32)
    assert np.allclose(activate("relu", z), [0, 0, 2])
    assert np.allclose(activate("silu", z), [-1 / (1 + math.e), 0, 2 / (1 + math.exp(-2))])
    assert np.allclose(activate("gelu", z), [-0.15865525, 0.0, 1.95449974], atol=1e-6)
    with pytest.raises(SimError):
        activate("swoosh", z)


def test_moe_routing_picks_top_k_and_renormalises():
    rng = np.random.default_rng(2)
    experts = [_ffn(rng, 8, 10, "relu", True, False) for _ in range(5)]
    moe = MoE(rng.standard_normal((5, 8)).astype(np.float32), experts, top_k=2)
    x = rng.standard_normal((7, 8)).astype(np.float32)
    chosen, w = moe.route(x)
    logits = x @ moe.router.T
    assert np.array_equal(chosen[:, 0], logits.argmax(axis=1))
    assert np.all(chosen[:, 0] != chosen[:, 1])
    assert np.allclose(w.sum(axis=1), 1.0) and np.all(w[:, 0] >= w[:, 1])
    y, h = moe.forward(x, chosen, w)
    ref = np.stack([sum(w[t, s] * experts[chosen[t, s]].dense(x[t:t + 1])[0] for s in range(2)) for t in range(7)])
    assert np.allclose(y, ref, atol=1e-5)
    assert h.shape == (7, 2, 10)
    masks = active_mask(h)
    y_sparse, _ = moe.forward(x, chosen, w, masks)
    assert np.allclose(y_sparse, y, atol=1e-5)


def test_bad_inputs_raise_simerror():
    rng = np.random.default_rng(0)
    ffn = _ffn(rng, 4, 5, "relu", True, False)
    with pytest.raises(SimError, match="neuron ids"):
        ffn.sparse(np.zeros(4, np.float32), np.array([5]))
    with pytest.raises(SimError, match="kernel"):
        ffn.sparse(np.zeros(4, np.float32), np.array([1]), kernel="cuda")
    with pytest.raises(SimError, match="bundle"):
        FFN(np.zeros((4, 5), np.float32), "relu")
    with pytest.raises(SimError, match="activation"):
        FFN(np.zeros((4, 2, 3), np.float32), "tanh")


def test_large_active_sets_are_split_across_threads_with_the_same_result():
    rng = np.random.default_rng(9)
    ffn = _ffn(rng, 768, 4096, "relu", glu=True, bias=False)
    x = rng.standard_normal(768).astype(np.float32)
    active = np.flatnonzero(ffn.intermediate(x[None])[0])
    assert active.size * x.size >= 1 << 20  # above the threading cut-off
    dense = ffn.dense(x[None])[0]
    assert np.allclose(ffn.sparse(x, active), dense, rtol=1e-4, atol=1e-5 * np.abs(dense).max())
