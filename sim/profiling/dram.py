"""DRAM streaming bandwidth, STREAM-style, with numpy: copy and triad by thread count.

A decode step streams weights from DRAM, so what a profile needs is the bandwidth one core
pulls alone (``mem_gbps`` of its cluster) and what all cores pull together
(``cpu.mem_gbps``). Each thread works on its own arrays, well beyond the caches, with
numpy's loops, which release the GIL; threads start each pass together at a barrier, and
the pass takes as long as its slowest thread's CPU time (``time.thread_time``). A core
streaming memory is busy all along (a stall on memory is CPU time), so on a quiet device
that is the wall-clock time of the pass; on a busy one it leaves out the spells another
process held the core, which are not the memory's: with 9 processes runnable on 2 cores a
256 MiB copy measured 6-12 GB/s by the wall clock and 15-22 GB/s by CPU time, the wall clock's
figure in a quieter minute (17-22 GB/s).
Bytes are counted as STREAM counts them: copy ``b[:] = a`` moves 2 arrays, triad
``a = b + s * c`` (two numpy passes through ``a``) moves 5.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.profiling.topology import pinned

MiB = 1024 * 1024
DEFAULT_ARRAY_BYTES = 64 * MiB  # per array and thread: beyond the last-level cache of phones and laptops


@dataclass(frozen=True)
class StreamResult:
    gbps: float
    threads: int
    kernel: str  # "copy" or "triad"


def _kernel(kind: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> int:
    """Run one pass of ``kind``; returns the bytes it moved (STREAM's count)."""
    if kind == "copy":
        np.copyto(b, a)
        return 2 * a.nbytes
    np.multiply(c, 3.0, out=a)
    np.add(a, b, out=a)
    return 5 * a.nbytes


def stream_bandwidth(kind: str = "copy", *, threads: int = 1, array_bytes: int = DEFAULT_ARRAY_BYTES,
                     passes: int = 3, cpus_per_thread: Sequence[Sequence[int] | None] | None = None) -> StreamResult:
    """Bandwidth of ``threads`` threads each running ``passes`` passes of ``kind`` on its own
    arrays of ``array_bytes`` (float64), pinned to ``cpus_per_thread[i]`` if given.

    Each thread's first pass only touches its pages in (not timed); the figure is the best
    pass of the group (timed as the module says), as STREAM reports its best of several trials.
    """
    if kind not in ("copy", "triad"):
        raise ValueError(f"kind must be copy or triad, got {kind!r}")
    n = max(1, array_bytes // 8)
    rounds = max(1, passes)
    barriers = [threading.Barrier(threads) for _ in range(rounds)]
    times: list[list[tuple[float, int]]] = [[] for _ in range(rounds)]  # per pass: (CPU seconds, bytes) per thread
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        cpus = cpus_per_thread[i] if cpus_per_thread else None
        try:
            with pinned(tuple(cpus) if cpus else None):
                a = np.ones(n)
                b = np.ones(n)
                c = np.ones(n) if kind == "triad" else b
                _kernel(kind, a, b, c)  # page faults and first touch, not timed
                for r in range(rounds):
                    barriers[r].wait()
                    start = time.thread_time()
                    moved = _kernel(kind, a, b, c)
                    with lock:
                        times[r].append((time.thread_time() - start, moved))
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            errors.append(exc)
            for barrier in barriers:
                barrier.abort()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in workers:
        t.start()
    try:
        for t in workers:
            while t.is_alive():
                t.join(0.05)
    except BaseException:
        for barrier in barriers:
            barrier.abort()
        for t in workers:
            t.join()
        raise
    if errors:
        raise errors[0]
    best = 0.0
    for rows in times:
        if len(rows) == threads:
            took = max(r[0] for r in rows)
            if took > 0:
                best = max(best, sum(r[1] for r in rows) / took / 1e9)
    return StreamResult(best, threads, kind)
