"""One step of the default calibration on the worker processes against one process: what parallelism buys.

A calibration is a sequence of steps, each a set of predictions asked for at once: a Jacobian
(every point at the current values and at one unknown moved per column) or a trial point.
This times one Jacobian at the bundled values (moved off them by ``SHIFTS`` of each prior's
width, so nothing is memoised: every edited trace is new, as in a real step) first in this
process, then on ``default_workers()`` processes at another shift, each with a fresh trace
store. It prints the wall time of each, the seconds the workers spent between them (the
parallel run does more work than the single one: each worker makes or reads the edited traces
its jobs need, and a trace's reader thread no longer has a core to itself) and, for the points
that cost most, a run's mean seconds in each. The ratio of the two walls is the speed-up the
workers give; the ratio of worker seconds, what running in parallel costs in extra work.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from sim.calibrate.apply import applicable
from sim.calibrate.calibration import load_calibration
from sim.calibrate.evaluator import Evaluator, default_workers
from sim.calibrate.fit import _step, on_grid
from sim.calibrate.unknowns import Unknown
from sim.traces.store import ENV_DIR
from sim.validation import load_points

SHIFTS = (0.013, 0.017)  # unit coordinates off the bundled values: a fresh trace for every preset column
SHOWN = 6


def jacobian_requests(points: list[Mapping[str, Any]], unknowns: list[Unknown], values: Mapping[str, float],
                      shift: float) -> list[tuple[Mapping[str, Any], dict[Unknown, float]]]:
    """Every point at ``values`` moved by ``shift``, and at each unknown moved by the fit's own
    difference step (widened for an integer unknown until its value changes), on its grid."""
    at = on_grid(np.array([u.to_unit(values[u.name]) + shift for u in unknowns]))
    columns = []
    for i in range(-1, len(unknowns)):  # -1: the base column
        x = at.copy()
        if i >= 0:
            x[i] += _step(unknowns[i], float(at[i]))
        x = on_grid(x)
        columns.append({u: u.from_unit(float(xi)) for u, xi in zip(unknowns, x, strict=True)})
    return [(p, {k: vals[k] for k in applicable(unknowns, p)}) for vals in columns for p in points]


def timed(requests: list, decode_tokens: int, workers: int) -> tuple[float, dict[str, tuple[int, float]]]:
    before = os.environ.get(ENV_DIR)
    with tempfile.TemporaryDirectory(prefix="calibration-step-") as store:
        os.environ[ENV_DIR] = store  # nothing stored yet (the spawned workers inherit it)
        try:
            with Evaluator(decode_tokens, workers=workers) as ev:
                t0 = time.perf_counter()
                ev.ensure(requests)
                return time.perf_counter() - t0, dict(ev.spent)
        finally:
            if before is None:
                del os.environ[ENV_DIR]
            else:
                os.environ[ENV_DIR] = before


def main() -> None:
    committed = load_calibration(None)
    assert committed is not None
    points = [p for p in load_points() if str(p["id"]) in committed.points]
    decode_tokens = int(committed.meta.get("decode_tokens", 128))
    workers = default_workers()
    one_wall, one = timed(jacobian_requests(points, committed.unknowns, committed.values, SHIFTS[0]),
                          decode_tokens, 1)
    par_wall, par = timed(jacobian_requests(points, committed.unknowns, committed.values, SHIFTS[1]),
                          decode_tokens, workers)
    one_busy, par_busy = (sum(s for _, s in spent.values()) for spent in (one, par))
    runs = sum(n for n, _ in par.values())
    print(f"one Jacobian of the default calibration ({len(points)} points, {len(committed.unknowns)} columns, "
          f"{runs} runs, {decode_tokens} decode tokens)")
    print(f"  one process: {one_wall:.1f} s")
    print(f"  {workers} workers: {par_wall:.1f} s wall ({one_wall / par_wall:.2f}x faster), "
          f"{par_busy:.1f} s of worker time ({par_busy / one_busy:.2f}x the one process's work)")
    for pid, (n, seconds) in sorted(par.items(), key=lambda kv: -kv[1][1])[:SHOWN]:
        alone = one[pid][1] / one[pid][0]
        print(f"  {pid}: {n} runs, {seconds / n:.2f} s a run on the workers, {alone:.2f} s in one process")


if __name__ == "__main__":  # the workers are spawned: they import this module, and must not rerun it
    main()
