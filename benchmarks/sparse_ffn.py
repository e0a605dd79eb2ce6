"""Dense vs sparse FFN time for one decode token (batch 1, fp32), in one run.

The FFN is Mistral-7B-sized by default (hidden 4096, 14336 neurons, gate/up/down, ReGLU).
The dense baseline is BLAS matrix-vector products over the usual contiguous matrices; the
sparse path is :meth:`sim.inference.ffn.FFN.sparse` over the bundled layout
(neuron i's gate row, up row and down column contiguous), given the active set. Both use
all cores (BLAS threads / numba threads). The active set at density p is the p*N neurons
with the largest gate pre-activation, so every listed neuron really fires (at 50% a few
sit at the boundary). The numpy gather (np.take + matmul) is timed for reference.

    python benchmarks/sparse_ffn.py [--hidden 4096] [--ffn 14336] [--repeats 15]

Caches are flushed before every timed run (a small active set would otherwise stay in
L3 between repeats, which a real decode step does not see). Times are the fastest of
--repeats cold runs; a speedup is the median ratio of alternating dense/sparse runs
(robust to other load on a shared machine). Prints a table and the speedups; the
project's target is >= 5x at 10% density.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numba
import numpy as np

from sim.inference.ffn import FFN

_SCRATCH = np.zeros(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB: twice a 32 MiB L3


def flush_caches() -> None:
    """Evict the CPU caches, as a real decode step finds them (weights are not cache-resident)."""
    np.add(_SCRATCH, 1.0, out=_SCRATCH)


def _timed(fn: Callable[[], object]) -> float:
    flush_caches()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_time_s(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of ``repeats`` cold-cache runs: the least disturbed by other work on a shared machine."""
    fn()  # warm up (JIT, page faults)
    return min(_timed(fn) for _ in range(repeats))


def paired(base: Callable[[], object], other: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """(best base s, best other s, median of per-pair base/other ratios), runs alternating.

    Alternating the two and taking the median ratio of neighbouring runs keeps the speedup
    honest when other processes slow the machine down for a while.
    """
    base()
    other()
    pairs = [(_timed(base), _timed(other)) for _ in range(repeats)]
    return (min(p[0] for p in pairs), min(p[1] for p in pairs), float(np.median([a / b for a, b in pairs])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    d, n = args.hidden, args.ffn
    rng = np.random.default_rng(args.seed)
    scale = np.float32(1.0 / np.sqrt(d))
    ffn = FFN(rng.standard_normal((n, 3, d), dtype=np.float32) * scale, "relu")
    w_gate = np.ascontiguousarray(ffn.bundle[:, 0, :])
    w_up = np.ascontiguousarray(ffn.bundle[:, 1, :])
    w_down = np.ascontiguousarray(ffn.bundle[:, 2, :].T)  # (d, N), the usual layout
    x = rng.standard_normal(d, dtype=np.float32)

    def dense() -> np.ndarray:
        return w_down @ (np.maximum(w_gate @ x, 0.0) * (w_up @ x))

    weights_mb = 3 * n * d * 4 / 1e6
    print(f"FFN hidden={d} neurons={n} (gate/up/down, ReGLU, fp32): {weights_mb:.0f} MB of weights")
    print(f"threads: numba {numba.get_num_threads()}, cpus {os.cpu_count()} (BLAS uses its own pool)")
    t_dense = best_time_s(dense, args.repeats)
    t_dense_bundled = best_time_s(lambda: ffn.dense(x[None, :]), args.repeats)
    print(f"dense, contiguous matrices (baseline): {t_dense * 1e3:8.2f} ms "
          f"({weights_mb / 1e3 / t_dense:.1f} GB/s)")
    print(f"dense, strided views of the bundle:    {t_dense_bundled * 1e3:8.2f} ms")

    gate = w_gate @ x
    positive = np.flatnonzero(gate > 0)
    y_ref = dense()
    y_sparse = ffn.sparse(x, positive)
    err = float(np.max(np.abs(y_sparse - y_ref)) / np.max(np.abs(y_ref)))
    print(f"check: sparse over all {positive.size} firing neurons vs dense: max rel diff {err:.1e}")

    print()
    print(f"{'density':>8} {'active':>7} {'dense ms':>9} {'sparse ms':>10} {'speedup':>8} {'np.take ms':>11} "
          f"{'speedup':>8}")
    results = {}
    for density in (0.50, 0.10, 0.03):
        k = int(round(density * n))
        idx = np.sort(np.argsort(-gate, kind="stable")[:k])
        t_d, t_sparse, ratio = paired(dense, lambda idx=idx: ffn.sparse(x, idx), args.repeats)
        t_d2, t_numpy, ratio_np = paired(dense, lambda idx=idx: ffn.sparse(x, idx, kernel="numpy"), args.repeats)
        results[density] = ratio
        print(f"{density:>8.0%} {k:>7d} {min(t_d, t_d2) * 1e3:>9.2f} {t_sparse * 1e3:>10.2f} {ratio:>7.1f}x "
              f"{t_numpy * 1e3:>11.2f} {ratio_np:>7.1f}x")
    verdict = "meets" if results[0.10] >= 5.0 else "MISSES"
    print(f"\nat 10% density the sparse kernel is {results[0.10]:.1f}x faster than dense: {verdict} the >= 5x target "
          "(ideal 10x)")


if __name__ == "__main__":
    main()
