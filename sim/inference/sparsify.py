"""Contextual sparsity for SiLU (SwiGLU) models, as CATS (arXiv 2404.08763) and TEAL do it.

A SwiGLU neuron's output is ``SiLU(gate . x) * (up . x)``; SiLU is never exactly zero, but
most neurons' gate activations are small for a given token. CATS keeps neuron ``i`` for a
token when ``|SiLU(gate_i . x)| > t_l`` and skips its up and down rows otherwise; the
per-layer threshold ``t_l`` is the ``1 - density`` quantile of ``|SiLU(gate . x)|`` over
calibration text, so each layer computes about ``density`` of its neurons. (TEAL cuts on
the magnitude of the FFN input instead; ``criterion="product"`` cuts on ``|h|``, the
product of both branches, which needs the up row of every neuron and so saves only the
down rows: the upper bound on what a perfect predictor of ``h`` could keep.)

:class:`ThresholdSparsity` is an ``active`` function for
:class:`~sim.inference.transformer.Transformer`: it computes the gate densely (one
matrix-vector product per layer, as CATS's kernel does) and hands the mask to the core's
sparse FFN kernel, which then reads only the kept neurons' bundles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from sim.errors import SimError

from .ffn import FFN, activate
from .transformer import KVCache, Transformer

CRITERIA = ("gate", "product")


def check_density(density: float, field: str = "--density") -> float:
    """A target density is a share of the FFN's neurons: (0, 1]."""
    if isinstance(density, bool) or not isinstance(density, int | float) or not 0.0 < float(density) <= 1.0:
        raise SimError(f"must be in (0, 1], got {density!r}", field=field)
    return float(density)


def _gate(net: Transformer, layer: int) -> np.ndarray:
    """The layer's gate rows as one contiguous matrix (the loader keeps them; else copy once)."""
    g = net.p.get(f"l{layer}.gate.weight")
    if g is None:
        ffn = net.ffns[layer]
        if not isinstance(ffn, FFN) or not ffn.glu:
            raise SimError("threshold sparsity needs a gated (SwiGLU) dense FFN", field="model")
        g = net.p[f"l{layer}.gate.weight"] = np.ascontiguousarray(ffn.bundle[:, 0, :])
    return g


def scores(net: Transformer, layer: int, x: np.ndarray, criterion: str = "gate") -> np.ndarray:
    """What the threshold is compared with, (T, N): |SiLU(gate . x)| or |h|."""
    ffn = net.ffns[layer]
    if not isinstance(ffn, FFN) or ffn.activation != "silu" or not ffn.glu:
        raise SimError("threshold sparsity is for SwiGLU FFNs (activation silu, gated)", field="model")
    if criterion == "gate":
        return np.abs(activate("silu", x @ _gate(net, layer).T))
    if criterion == "product":
        return np.abs(ffn.intermediate(x))
    raise SimError(f"unknown criterion {criterion!r}; known: {list(CRITERIA)}", field="criterion")


@dataclass
class ThresholdSparsity:
    """Per-layer thresholds; calling it gives the (T, 1, N) mask of neurons to compute."""

    net: Transformer
    thresholds: np.ndarray  # (L,)
    criterion: str = "gate"
    target_density: float = 1.0

    def __call__(self, layer: int, x: np.ndarray, experts: np.ndarray) -> np.ndarray:
        return (scores(self.net, layer, x, self.criterion) > self.thresholds[layer])[:, None, :]


def calibrate(net: Transformer, ids: np.ndarray, density: float, *, criterion: str = "gate",
              block: int = 256) -> ThresholdSparsity:
    """Thresholds that keep ``density`` of each layer's neurons on the calibration tokens ``ids``.

    The calibration pass is dense and teacher-forced (blocks of ``block`` tokens), so the
    thresholds do not depend on the sparsity they set.
    """
    density = check_density(density, "density")
    if criterion not in CRITERIA:
        raise SimError(f"unknown criterion {criterion!r}; known: {list(CRITERIA)}", field="criterion")
    ids = np.asarray(ids, np.int64)
    if ids.size < 1:
        raise SimError("no calibration tokens", field="calibration")
    n_layers = net.cfg.n_layers
    seen: list[list[np.ndarray]] = [[] for _ in range(n_layers)]

    def hook(layer: int, x: np.ndarray, experts: np.ndarray, h: np.ndarray) -> None:
        seen[layer].append(np.abs(h[:, 0, :]) if criterion == "product" else scores(net, layer, x, "gate"))

    with threadpool_limits(limits=1, user_api="blas"):
        for start in range(0, ids.size, block):
            net.forward(ids[start:start + block], KVCache(), hook=hook)
    thr = np.array([np.quantile(np.concatenate(s).ravel(), 1.0 - density) if density < 1.0 else -1.0
                    for s in seen], dtype=np.float64)
    return ThresholdSparsity(net, thr, criterion, density)
