"""Activation predictors: the oracle and a trained low-rank predictor, with measured quality.

A sparse-inference runtime guesses each token's active neurons *before* running the FFN,
from the FFN input ``x``. LLM in a Flash and PowerInfer use a small low-rank model per
layer; here :class:`LowRankPredictor` scores neurons as ``U (V x) + b`` and predicts those
whose score exceeds a threshold ``tau``.

Training (:func:`fit_lowrank`) is closed-form reduced-rank ridge regression: regress the
neurons' pre-activations (for ReLU/GELU activity is a monotone function of them; else the
0/1 activity labels) on ``x``, keep the best rank-``r`` approximation of the fit (project
onto the top ``r`` right singular vectors of the fitted scores), then pick ``tau`` on
held-out calibration rows so that a target share of the true activations
(``target_recall``, default 0.95, LLM in a Flash's ~5% false negatives) is predicted.
Quality is then *measured* on tokens the predictor never saw (:func:`evaluate`): recall,
precision and false-negative rate per layer.

The simulator charges for the predictor, so its size and cost are reported:
``size_bytes = (r d + N r + N) * bytes_per_value`` and
``flops_per_token = 2 r d + 2 N r + N`` (two matvecs, bias add; the compare is free).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from sim.errors import SimError

from .ffn import MoE, active_mask
from .transformer import Transformer


@dataclass
class LowRankPredictor:
    """score = U (V x) + b; a neuron is predicted active when its score > tau."""

    V: np.ndarray  # (r, d)
    U: np.ndarray  # (N, r)
    b: np.ndarray  # (N,)
    tau: float

    @property
    def rank(self) -> int:
        return self.V.shape[0]

    def scores(self, x: np.ndarray) -> np.ndarray:
        return (x @ self.V.T) @ self.U.T + self.b

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Boolean mask (T, N) of neurons predicted active for inputs x (T, d)."""
        return self.scores(x) > self.tau

    def size_bytes(self, bytes_per_value: int = 4) -> int:
        return int((self.V.size + self.U.size + self.b.size) * bytes_per_value)

    def flops_per_token(self) -> int:
        r, d = self.V.shape
        n = self.U.shape[0]
        return int(2 * r * d + 2 * n * r + n)


def fit_lowrank(x: np.ndarray, active: np.ndarray, rank: int, *, target: np.ndarray | None = None,
                target_recall: float = 0.95, ridge: float = 1e-2, calib_share: float = 0.25) -> LowRankPredictor:
    """Fit a rank-``rank`` predictor of ``active`` (T, N bool) from FFN inputs ``x`` (T, d).

    ``target`` (T, N) is what the scores regress on: the neurons' pre-activations when
    activity is a monotone function of them (ReLU, GELU: the recorder passes them), else
    the 0/1 labels themselves. The last ``calib_share`` of the rows is held out of the fit
    and used to set ``tau``, so the recall reached on unseen tokens is close to
    ``target_recall`` instead of the optimistic in-sample figure. ``ridge`` is relative to
    the mean input variance, so it is scale-free.
    """
    if x.ndim != 2 or active.ndim != 2 or x.shape[0] != active.shape[0]:
        raise SimError(f"need x (T, d) and active (T, N) with equal T, got {x.shape} and {active.shape}",
                       field="predictor")
    if target is not None and target.shape != active.shape:
        raise SimError(f"target {target.shape} must match active {active.shape}", field="predictor")
    if rank < 1:
        raise SimError(f"rank must be >= 1, got {rank}", field="predictor.rank")
    if not 0.0 < target_recall <= 1.0:
        raise SimError(f"target_recall must be in (0, 1], got {target_recall}", field="predictor.target_recall")
    if x.shape[0] < 2:
        raise SimError(f"need at least 2 training tokens, got {x.shape[0]}", field="predictor")
    n_tok = x.shape[0]
    n_fit = n_tok - int(n_tok * calib_share) if n_tok >= 8 else n_tok
    # Small LAPACK problems: one BLAS thread is faster, and far faster when cores are busy
    # (OpenBLAS threads spin-wait; an SVD of 150 x 256 took 1 s instead of 5 ms under load).
    with threadpool_limits(limits=1, user_api="blas"):
        return _fit(x, active, rank, target, target_recall, ridge, n_fit)


def _fit(x: np.ndarray, active: np.ndarray, rank: int, target: np.ndarray | None, target_recall: float,
         ridge: float, n_fit: int) -> LowRankPredictor:
    n_tok, d = x.shape
    n = active.shape[1]
    x64 = x[:n_fit].astype(np.float64)
    y = (active if target is None else target)[:n_fit].astype(np.float64)
    mu_x, mu_y = x64.mean(axis=0), y.mean(axis=0)
    xc, yc = x64 - mu_x, y - mu_y
    gram = xc.T @ xc
    lam = ridge * max(float(np.trace(gram)) / d, 1e-12)
    coef = np.linalg.solve(gram + lam * np.eye(d), xc.T @ yc)  # (d, N)
    r = min(rank, d, n)
    _, _, vt = np.linalg.svd(xc @ coef, full_matrices=False)
    u = vt[:r].T  # (N, r): the output subspace kept
    v = (coef @ u).T  # (r, d)
    b = mu_y - (mu_x @ v.T) @ u.T
    pred = LowRankPredictor(v.astype(np.float32), u.astype(np.float32), b.astype(np.float32), 0.0)
    calib = slice(n_fit, None) if n_fit < n_tok and active[n_fit:].any() else slice(None)
    pos = pred.scores(x[calib])[active[calib]]
    if pos.size == 0:
        pred.tau = float("inf")  # nothing ever fired: predict nothing
    else:
        pred.tau = float(np.quantile(pos, 1.0 - target_recall)) - 1e-6
    return pred


@dataclass(frozen=True)
class Quality:
    """Prediction quality over a set of (token, neuron) decisions."""

    true_positives: int
    false_negatives: int
    false_positives: int

    @property
    def recall(self) -> float:
        act = self.true_positives + self.false_negatives
        return self.true_positives / act if act else 1.0

    @property
    def precision(self) -> float:
        pred = self.true_positives + self.false_positives
        return self.true_positives / pred if pred else 1.0

    @property
    def fnr(self) -> float:
        return 1.0 - self.recall

    def __add__(self, other: Quality) -> Quality:
        return Quality(self.true_positives + other.true_positives, self.false_negatives + other.false_negatives,
                       self.false_positives + other.false_positives)


def evaluate(predicted: np.ndarray, active: np.ndarray) -> Quality:
    """Count hits and misses of boolean masks of equal shape."""
    if predicted.shape != active.shape:
        raise SimError(f"predicted {predicted.shape} and active {active.shape} differ in shape", field="predictor")
    tp = int(np.count_nonzero(predicted & active))
    return Quality(tp, int(np.count_nonzero(active)) - tp, int(np.count_nonzero(predicted)) - tp)


def default_rank(hidden: int, n_neurons: int) -> int:
    """Rank used when none is given: hidden/6 capped at 128 (FLASH uses 128 at hidden 4096).

    At that rank the predictor costs about 2 r (d + N) / (4 d N) of a dense FFN pass
    (~10% for MiniLM, ~2% for a 7B model).
    """
    return int(max(4, min(128, hidden // 6, n_neurons)))


class OraclePredictor:
    """Predicts exactly the active set (computed densely): the upper bound, and the test tool.

    Usable as a :class:`~sim.inference.transformer.Transformer` ``active`` function, so a
    model can be run through its sparse kernels with perfect predictions.
    """

    def __init__(self, model: Transformer, threshold: float = 0.0):
        self.model = model
        self.threshold = threshold

    def __call__(self, layer: int, x: np.ndarray, experts: np.ndarray) -> np.ndarray:
        ffn = self.model.ffns[layer]
        if isinstance(ffn, MoE):
            n = ffn.experts[0].n_neurons
            out = np.zeros((*experts.shape, n), dtype=bool)
            for slot in range(experts.shape[1]):
                for t in range(experts.shape[0]):
                    h = ffn.experts[int(experts[t, slot])].intermediate(x[t:t + 1])
                    out[t, slot] = active_mask(h[0], self.threshold)
            return out
        return active_mask(ffn.intermediate(x), self.threshold)[:, None, :]
