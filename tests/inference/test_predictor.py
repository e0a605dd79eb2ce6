"""The low-rank predictor: training, measured quality, size and cost; the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import SimError
from sim.inference.predictor import OraclePredictor, Quality, default_rank, evaluate, fit_lowrank
from sim.inference.transformer import Transformer
from sim.inference.weights import build_tiny


def _low_rank_problem(seed: int, n_tok: int, d: int = 48, n: int = 200, true_rank: int = 6):
    """Activity = (low-rank linear map of x) > 0.8: a predictor of that rank can learn it."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, true_rank)) @ rng.standard_normal((true_rank, d)) / np.sqrt(d)
    x = rng.standard_normal((n_tok, d)).astype(np.float32)
    z = x @ w.T
    return x, z, z > 0.8


def test_recall_on_unseen_tokens_is_near_the_target():
    x, z, act = _low_rank_problem(0, 3000)
    p = fit_lowrank(x[:2000], act[:2000], rank=6, target=z[:2000], target_recall=0.9)
    q = evaluate(p.predict(x[2000:]), act[2000:])
    assert q.recall == pytest.approx(0.9, abs=0.03)
    assert q.precision > 0.9  # the structure is exactly low-rank and linear
    assert q.fnr == pytest.approx(1 - q.recall)


def test_label_targets_also_learn_and_more_rank_helps_a_harder_problem():
    x, _, act = _low_rank_problem(1, 3000, true_rank=24)
    precisions = []
    for rank in (2, 24):
        p = fit_lowrank(x[:2000], act[:2000], rank=rank, target_recall=0.95)
        precisions.append(evaluate(p.predict(x[2000:]), act[2000:]).precision)
    assert precisions[1] > precisions[0] + 0.05


def test_size_and_flops_follow_the_shapes():
    x, z, act = _low_rank_problem(2, 300)
    p = fit_lowrank(x, act, rank=10, target=z)
    d, n = 48, 200
    assert p.V.shape == (10, d) and p.U.shape == (n, 10)
    assert p.size_bytes() == (10 * d + n * 10 + n) * 4
    assert p.size_bytes(2) == (10 * d + n * 10 + n) * 2
    assert p.flops_per_token() == 2 * 10 * d + 2 * n * 10 + n


def test_nothing_ever_active_predicts_nothing():
    x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    p = fit_lowrank(x, np.zeros((50, 16), bool), rank=4)
    assert not p.predict(x).any()


def test_evaluate_counts():
    pred = np.array([[1, 1, 0, 0]], bool)
    act = np.array([[1, 0, 1, 0]], bool)
    q = evaluate(pred, act)
    assert (q.true_positives, q.false_negatives, q.false_positives) == (1, 1, 1)
    assert (q.recall, q.precision) == (0.5, 0.5)
    assert (q + q).true_positives == 2
    assert Quality(0, 0, 0).recall == 1.0
    with pytest.raises(SimError):
        evaluate(pred, act[:, :2])


def test_bad_training_inputs():
    x = np.zeros((10, 4), np.float32)
    with pytest.raises(SimError, match="rank"):
        fit_lowrank(x, np.zeros((10, 3), bool), rank=0)
    with pytest.raises(SimError, match="equal T"):
        fit_lowrank(x, np.zeros((9, 3), bool), rank=2)
    with pytest.raises(SimError, match="target_recall"):
        fit_lowrank(x, np.zeros((10, 3), bool), rank=2, target_recall=1.5)


def test_oracle_matches_dense_activity():
    model = Transformer(build_tiny("tiny-mixtral", seed=5))
    seen = {}
    model.forward(np.arange(3, 12), hook=lambda layer, x, e, h: seen.setdefault(layer, (x, e, h)))
    oracle = OraclePredictor(model, 0.0)
    for layer, (x, experts, h) in seen.items():
        assert np.array_equal(oracle(layer, x, experts), h != 0)


def test_default_rank_is_bounded():
    assert default_rank(384, 1536) == 64
    assert default_rank(4096, 14336) == 128
    assert default_rank(16, 8) == 4
