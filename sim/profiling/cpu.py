"""Per-core throughput of the kernels the engine charges, measured on one pinned thread.

The engine times a CPU kernel by its class (``sim.hw.processors.KERNELS``): dense GEMV,
sparse GEMV over gathered neuron rows and GEMM, at ``int8_gops`` (quantised weights) or
``fp32_gflops`` times ``kernel_speed``. It takes the larger of that compute time and the
bytes over the core's DRAM bandwidth (a roofline), so the compute rates are measured on
operands that stay in the caches; :mod:`sim.profiling.dram` measures the other side.

fp32 kernels are numpy's (the BLAS it ships, held to one thread); numpy's integer matmul
is a plain loop, so int8 kernels are small numba loops (int8 products accumulated in
int32) that LLVM vectorises with the core's SIMD dot-product instructions, as a phone
runtime's hand-written kernels do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numba as nb
import numpy as np
from threadpoolctl import threadpool_limits

from sim.profiling.topology import pinned

KINDS = ("gemm", "dense_gemv", "sparse_gemv")
GEMV_ROWS, GEMV_COLS = 256, 1024  # 1 MiB of fp32, 256 KiB of int8: resident in a core's L2
GATHER_FROM = 4096  # sparse GEMV gathers GEMV_ROWS of this many rows (6% active, a sparse FFN's order)
GEMM_N = 256  # square fp32 GEMM; int8 GEMM is (128 x GEMV_COLS) @ (GEMV_COLS x 128)
INT8_BATCH = 128


@nb.njit(cache=True, fastmath=True, boundscheck=False)
def _gemv_i8(w: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    rows, cols = w.shape
    for i in range(rows):
        acc = np.int32(0)
        for j in range(cols):
            acc += np.int32(w[i, j]) * np.int32(x[j])
        out[i] = acc


@nb.njit(cache=True, fastmath=True, boundscheck=False)
def _sparse_gemv_i8(w: np.ndarray, rows: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    cols = w.shape[1]
    for k in range(rows.size):
        r = rows[k]
        acc = np.int32(0)
        for j in range(cols):
            acc += np.int32(w[r, j]) * np.int32(x[j])
        out[k] = acc


@nb.njit(cache=True, fastmath=True, boundscheck=False)
def _gemm_i8(a: np.ndarray, bt: np.ndarray, out: np.ndarray) -> None:
    n, k = a.shape
    m = bt.shape[0]
    for i in range(n):
        for j in range(m):
            acc = np.int32(0)
            for p in range(k):
                acc += np.int32(a[i, p]) * np.int32(bt[j, p])
            out[i, j] = acc


@dataclass(frozen=True)
class KernelRates:
    """Operations per second (G) one core reached on each kernel class, per dtype."""

    fp32: dict[str, float]
    int8: dict[str, float]
    pinned: bool


def _rate(run: Callable[[], None], ops: float, duration_s: float) -> float:
    """Best rate over repeated calls for about ``duration_s`` (after one warm-up call)."""
    run()
    best = float("inf")
    deadline = time.perf_counter() + duration_s
    while True:
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() >= deadline:
            break
    return ops / best / 1e9 if best > 0 else 0.0


def _kernels(rng: np.random.Generator) -> dict[tuple[str, str], tuple[Callable[[], None], float]]:
    """Each (dtype, kernel) as a call and its operation count (a multiply-add is 2)."""
    w32 = rng.standard_normal((GEMV_ROWS, GEMV_COLS), dtype=np.float32)
    big32 = rng.standard_normal((GATHER_FROM, GEMV_COLS), dtype=np.float32)
    x32 = rng.standard_normal(GEMV_COLS, dtype=np.float32)
    rows = np.sort(rng.choice(GATHER_FROM, GEMV_ROWS, replace=False)).astype(np.int64)
    a32 = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
    b32 = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
    w8 = rng.integers(-127, 128, (GEMV_ROWS, GEMV_COLS), dtype=np.int8)
    big8 = rng.integers(-127, 128, (GATHER_FROM, GEMV_COLS), dtype=np.int8)
    x8 = rng.integers(-127, 128, GEMV_COLS, dtype=np.int8)
    a8 = rng.integers(-127, 128, (INT8_BATCH, GEMV_COLS), dtype=np.int8)
    bt8 = rng.integers(-127, 128, (INT8_BATCH, GEMV_COLS), dtype=np.int8)
    out_v = np.empty(GEMV_ROWS, np.int32)
    out_m = np.empty((INT8_BATCH, INT8_BATCH), np.int32)
    reps = 16  # GEMV calls are microseconds: time a few together
    gemv_ops = 2.0 * GEMV_ROWS * GEMV_COLS

    def loop(call: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(reps):
                call()
        return run

    return {
        ("fp32", "gemm"): (lambda: np.matmul(a32, b32), 2.0 * GEMM_N ** 3),
        ("fp32", "dense_gemv"): (loop(lambda: w32 @ x32), reps * gemv_ops),
        ("fp32", "sparse_gemv"): (loop(lambda: big32[rows] @ x32), reps * gemv_ops),
        ("int8", "gemm"): (lambda: _gemm_i8(a8, bt8, out_m), 2.0 * INT8_BATCH * INT8_BATCH * GEMV_COLS),
        ("int8", "dense_gemv"): (loop(lambda: _gemv_i8(w8, x8, out_v)), reps * gemv_ops),
        ("int8", "sparse_gemv"): (loop(lambda: _sparse_gemv_i8(big8, rows, x8, out_v)), reps * gemv_ops),
    }


def kernel_rates(cpus: tuple[int, ...] | None, duration_s: float = 0.2, seed: int = 0,
                 on_kernel: Callable[[], None] | None = None) -> KernelRates:
    """Every kernel class in fp32 and int8 on one thread pinned to ``cpus`` (one cluster's)."""
    rates: dict[str, dict[str, float]] = {"fp32": {}, "int8": {}}
    with pinned(cpus) as is_pinned, threadpool_limits(limits=1):
        for (dtype, kind), (run, ops) in _kernels(np.random.default_rng(seed)).items():
            rates[dtype][kind] = _rate(run, ops, duration_s)
            if on_kernel is not None:
                on_kernel()
    return KernelRates(rates["fp32"], rates["int8"], is_pinned)
