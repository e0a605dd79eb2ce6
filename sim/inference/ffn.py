"""Feed-forward blocks: dense and sparse kernels over the bundled neuron layout, MoE routing.

**Bundled layout.** An FFN of ``N`` neurons over hidden size ``d`` is stored as one C-ordered
array ``bundle`` of shape ``(N, R, d)``: for a gated FFN (SwiGLU / ReGLU / dReLU, ``R = 3``)
row ``i`` holds neuron ``i``'s gate row, up row and down column; for a plain MLP (OPT, BERT,
``R = 2``) its up (fc1) row and down (fc2) column. This is the on-flash layout of
PowerInfer-2 and LLM in a Flash ("row-column bundling"): everything neuron ``i`` needs is
contiguous, so a sparse step reads only the bundles of the active neurons.

**Activity.** Neuron ``i`` is *active* for a token when its intermediate output
``h_i = act(gate_i . x) * (up_i . x)`` (gated) or ``h_i = act(up_i . x + b_i)`` (MLP)
satisfies ``|h_i| > threshold``. For the ReLU family (``relu``, ``drelu``) the default
threshold 0 is exact: an inactive neuron contributes nothing, so the sparse path over the
oracle active set reproduces the dense output. SiLU and GELU are never exactly zero, so
for them activity is a modelling choice, set by the threshold (see the recorder).

**Kernels.** :meth:`FFN.dense` uses BLAS over strided views of the bundle.
:meth:`FFN.sparse` gathers only the listed neurons: a numba kernel (large active lists are
split across threads, one accumulator each) that reads each bundle row in place, and for
the ReLU family reads the up row only when the gate is positive (PowerInfer-2's
"Gate first, Up/Down only if needed"). A numpy path (``np.take`` + matmul) is kept for
reference; it copies the gathered rows and is several times slower (see
``benchmarks/sparse_ffn.py``).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

from sim.errors import SimError

from .weights import ACTIVATIONS, ModelConfig

_ACT_CODE = {name: i for i, name in enumerate(ACTIVATIONS)}  # relu, drelu, silu, gelu, gelu_tanh
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def erf(x: np.ndarray) -> np.ndarray:
    """Error function to ~1.5e-7 absolute (Abramowitz & Stegun 7.1.26), enough for fp32.

    numpy has no erf and scipy is not a dependency; BERT's GELU needs the exact (erf) form.
    """
    x = np.asarray(x, dtype=np.float64)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def activate(kind: str, z: np.ndarray) -> np.ndarray:
    """Apply a pointwise activation (for ``drelu`` this is plain ReLU on one operand)."""
    if kind in ("relu", "drelu"):
        return np.maximum(z, 0.0)
    if kind == "silu":
        return z / (1.0 + np.exp(-z))
    if kind == "gelu":
        return (0.5 * z * (1.0 + erf(z / math.sqrt(2.0)))).astype(z.dtype)
    if kind == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(_SQRT_2_OVER_PI * (z + 0.044715 * z**3)))
    raise SimError(f"unknown activation {kind!r}; known: {list(ACTIVATIONS)}", field="activation")


def active_mask(h: np.ndarray, threshold: float = 0.0) -> np.ndarray:
    """Which neurons are active: ``|h| > threshold`` (exact non-zero test at threshold 0)."""
    return np.abs(h) > threshold


# ---------------------------------------------------------------------------------------
# numba sparse kernel
# ---------------------------------------------------------------------------------------
@numba.njit(inline="always", fastmath=True)
def _act_scalar(code: int, z: float) -> float:
    if code <= 1:
        return z if z > 0.0 else 0.0
    if code == 2:
        return z / (1.0 + math.exp(-z))
    if code == 3:
        return 0.5 * z * (1.0 + math.erf(z * 0.7071067811865476))
    return 0.5 * z * (1.0 + math.tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))


@numba.njit(fastmath=True, cache=True, nogil=True)
def _sparse_kernel(x, bundle, idx, b_in, code, glu):  # pragma: no cover - compiled
    """Sum over neurons ``idx`` of h_i * down_i, reading bundle rows in place.

    Neurons go in pairs so that two rows stream from memory at once: a sparse FFN step is
    bound by memory latency, and one row at a time leaves half the bandwidth unused.
    """
    n_tok, d = x.shape
    last = bundle.shape[1] - 1
    out = np.zeros((n_tok, d), dtype=np.float32)
    n = idx.shape[0]
    for j in range(0, n, 2):
        i0 = idx[j]
        pair = j + 1 < n
        i1 = idx[j + 1] if pair else i0
        for s in range(n_tok):
            z0 = np.float32(0.0)
            z1 = np.float32(0.0)
            for k in range(d):
                xv = x[s, k]
                z0 += bundle[i0, 0, k] * xv
                z1 += bundle[i1, 0, k] * xv
            a0 = _act_scalar(code, z0 + b_in[i0])
            a1 = _act_scalar(code, z1 + b_in[i1]) if pair else np.float32(0.0)
            # ReLU family: a zero gate (or fc1) output means the up and down rows are not needed
            if glu and (a0 != 0.0 or a1 != 0.0):
                u0 = np.float32(0.0)
                u1 = np.float32(0.0)
                for k in range(d):
                    xv = x[s, k]
                    u0 += bundle[i0, 1, k] * xv
                    u1 += bundle[i1, 1, k] * xv
                if code == 1:  # dReLU: ReLU on both branches
                    u0 = u0 if u0 > 0.0 else 0.0
                    u1 = u1 if u1 > 0.0 else 0.0
                a0 = a0 * u0
                a1 = a1 * u1
            if a0 != 0.0 or a1 != 0.0:
                f0 = np.float32(a0)  # keep the axpy in fp32 (twice the SIMD width of fp64)
                f1 = np.float32(a1)
                for k in range(d):
                    out[s, k] += f0 * bundle[i0, last, k] + f1 * bundle[i1, last, k]
    return out


# Work (neurons x tokens x hidden) above which the active list is split across threads. The
# kernel releases the GIL, so plain threads run it in parallel; a numba ``parallel=True``
# kernel would do the same but takes several times longer to compile.
_PARALLEL_MIN_WORK = 1 << 20
_POOL: ThreadPoolExecutor | None = None


def _run_sparse(x: np.ndarray, bundle: np.ndarray, idx: np.ndarray, b_in: np.ndarray, code: int,
                glu: bool) -> np.ndarray:
    global _POOL
    n_threads = numba.get_num_threads()
    if n_threads < 2 or idx.size * x.size < _PARALLEL_MIN_WORK:
        return _sparse_kernel(x, bundle, idx, b_in, code, glu)
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="sparse-ffn")
    # a few parts per thread, so a thread that the OS delays does not hold up the others
    parts = np.array_split(idx, min(4 * n_threads, max(1, idx.size // 64)))
    futures = [_POOL.submit(_sparse_kernel, x, bundle, part, b_in, code, glu) for part in parts]
    return sum(f.result() for f in futures)


@dataclass
class FFN:
    """One FFN (or one expert) in the bundled layout, with optional biases (OPT, BERT)."""

    bundle: np.ndarray  # (N, 3, d) gated or (N, 2, d) MLP, float32, C-contiguous
    activation: str
    b_in: np.ndarray | None = None  # (N,) fc1 bias
    b_out: np.ndarray | None = None  # (d,) fc2 bias

    def __post_init__(self) -> None:
        if self.activation not in _ACT_CODE:
            raise SimError(f"unknown activation {self.activation!r}; known: {list(ACTIVATIONS)}",
                           field="activation")
        if self.bundle.ndim != 3 or self.bundle.shape[1] not in (2, 3):
            raise SimError(f"bundle must have shape (N, 2|3, d), got {self.bundle.shape}", field="bundle")
        self.bundle = np.ascontiguousarray(self.bundle, dtype=np.float32)

    @classmethod
    def from_matrices(cls, up: np.ndarray, down: np.ndarray, activation: str, gate: np.ndarray | None = None,
                      b_in: np.ndarray | None = None, b_out: np.ndarray | None = None) -> FFN:
        """Bundle HF-shaped matrices: gate/up (N, d), down (d, N)."""
        rows = [gate, up, down.T] if gate is not None else [up, down.T]
        return cls(np.stack(rows, axis=1), activation, b_in, b_out)

    @property
    def glu(self) -> bool:
        return self.bundle.shape[1] == 3

    @property
    def n_neurons(self) -> int:
        return self.bundle.shape[0]

    @property
    def hidden(self) -> int:
        return self.bundle.shape[2]

    # -- dense --------------------------------------------------------------------------
    def intermediate(self, x: np.ndarray) -> np.ndarray:
        """Neuron outputs ``h`` (T, N) for inputs ``x`` (T, d)."""
        z = x @ self.bundle[:, 0, :].T
        if self.b_in is not None:
            z += self.b_in
        a = activate(self.activation, z)
        if self.glu:
            u = x @ self.bundle[:, 1, :].T
            if self.activation == "drelu":
                u = np.maximum(u, 0.0)
            a = a * u
        return a.astype(np.float32, copy=False)

    def output(self, h: np.ndarray) -> np.ndarray:
        """Down projection of neuron outputs ``h`` (T, N) -> (T, d)."""
        y = h @ self.bundle[:, -1, :]
        if self.b_out is not None:
            y += self.b_out
        return y

    def dense(self, x: np.ndarray) -> np.ndarray:
        return self.output(self.intermediate(x))

    # -- sparse -------------------------------------------------------------------------
    def sparse(self, x: np.ndarray, idx: np.ndarray, kernel: str = "numba") -> np.ndarray:
        """FFN output computed from neurons ``idx`` only (x: (d,) or (T, d); one set for all T).

        With ``idx`` a superset of the active neurons of every row of ``x`` and a ReLU-family
        activation this equals :meth:`dense` up to float rounding.
        """
        x = np.asarray(x, dtype=np.float32)
        single = x.ndim == 1
        x2 = np.ascontiguousarray(x[None, :] if single else x)
        idx = np.asarray(idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_neurons):
            raise SimError(f"neuron ids must be in [0, {self.n_neurons})", field="idx")
        if kernel == "numba":
            b_in = self.b_in if self.b_in is not None else np.zeros(self.n_neurons, np.float32)
            y = _run_sparse(x2, self.bundle, idx.astype(np.int64, copy=False), b_in.astype(np.float32),
                            _ACT_CODE[self.activation], self.glu)
            if self.b_out is not None:
                y += self.b_out
        elif kernel == "numpy":
            sub = np.take(self.bundle, idx, axis=0)  # (k, R, d): the gather, as from flash
            part = FFN(sub, self.activation, None if self.b_in is None else self.b_in[idx], self.b_out)
            y = part.dense(x2)
        else:
            raise SimError(f"unknown kernel {kernel!r}; known: ['numba', 'numpy']", field="kernel")
        return y[0] if single else y


@dataclass
class MoE:
    """Mixtral-style routed experts: softmax router, top-k, weights renormalised over the k."""

    router: np.ndarray  # (E, d)
    experts: list[FFN]
    top_k: int

    @property
    def n_experts(self) -> int:
        return len(self.experts)

    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Chosen experts (T, k), best first, and their renormalised weights (T, k)."""
        logits = x @ self.router.T
        order = np.argsort(-logits, axis=1, kind="stable")[:, : self.top_k]
        top = np.take_along_axis(logits, order, axis=1)
        w = np.exp(top - top[:, :1])
        w /= w.sum(axis=1, keepdims=True)
        return order, w.astype(np.float32)

    def forward(self, x: np.ndarray, experts: np.ndarray, weights: np.ndarray,
                masks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Combine the chosen experts' outputs; dense (returns h (T, k, N)) or sparse by masks."""
        n_tok = x.shape[0]
        y = np.zeros_like(x, dtype=np.float32)
        h_all = None if masks is not None else np.zeros((n_tok, self.top_k, self.experts[0].n_neurons),
                                                        np.float32)
        for e in np.unique(experts):
            rows, slots = np.nonzero(experts == e)
            ffn = self.experts[int(e)]
            if masks is None:
                h = ffn.intermediate(x[rows])
                h_all[rows, slots] = h
                out = ffn.output(h)
            else:
                out = np.stack([ffn.sparse(x[r], np.flatnonzero(masks[r, s])) for r, s in zip(rows, slots,
                                                                                             strict=True)])
            y[rows] += weights[rows, slots, None] * out
        return y, h_all


def build_ffn(params: dict[str, np.ndarray], prefix: str, cfg: ModelConfig) -> FFN:
    """Bundle one FFN (``prefix`` is e.g. ``l3.`` or ``l3.e1.``) from canonical params."""
    return FFN.from_matrices(params[prefix + "up.weight"], params[prefix + "down.weight"], cfg.activation,
                             gate=params.get(prefix + "gate.weight"), b_in=params.get(prefix + "up.bias"),
                             b_out=params.get(prefix + "down.bias"))


def build_layer_ffn(params: dict[str, np.ndarray], layer: int, cfg: ModelConfig) -> FFN | MoE:
    p = f"l{layer}."
    if cfg.arch == "mixtral":
        return MoE(params[p + "router.weight"], [build_ffn(params, f"{p}e{e}.", cfg)
                                                 for e in range(cfg.n_experts)], cfg.top_k)
    return build_ffn(params, p, cfg)
