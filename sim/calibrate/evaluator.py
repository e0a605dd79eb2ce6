"""Predictions of published points at given unknown values: each computed once, several at a time.

A fit asks for the same (point, values) pair many times (a difference step of one unknown
leaves every point outside its scope where it was; a cross-validation fold revisits the full
fit's first steps), and each new pair is a whole simulation, seconds long. So predictions
are memoised by the point and the values in its scope, and the ones a step needs at once
(the residuals of a trial point, or every column of a Jacobian) run in parallel worker
processes. Workers are started with ``spawn``: the parent may hold threads (the trace
replay's reader), which a forked child would inherit mid-lock.

Jobs that read the same edited trace go to one worker, which makes the trace once; but a
step often has a single such group (a fold's trial point edits one family's preset, and
every knob column of a Jacobian reads the base trace), which then ran on one worker while
the others idled. So groups are balanced by each point's last measured run time: a group
holding more than a worker's share of the step is split (each part makes the trace again,
a second or two, against the simulations' many).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from sim.calibrate.apply import applicable, run_overrides
from sim.calibrate.unknowns import Unknown
from sim.errors import SimError

Key = tuple
# a point's run time before one has been measured (seconds; a typical 128-token decode point)
UNMEASURED_S = 1.0


def default_workers() -> int:
    """One worker per core the process may use (2 on the CI machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _predict_many(jobs: list[tuple[Mapping[str, Any], Mapping[Unknown, float]]],
                  decode_tokens: int) -> list[tuple[float, float]]:
    """Each job's prediction and the seconds it took (what the next step's balance uses)."""
    out = []
    for point, values in jobs:
        t0 = time.perf_counter()
        out.append((predict(point, values, decode_tokens=decode_tokens), time.perf_counter() - t0))
    return out


def balance(groups: list[list[Key]], seconds: Callable[[Key], float], workers: int) -> list[list[Key]]:
    """Split each group costing more than a worker's share of the total into that many parts
    (longest jobs first, each to the lightest part); return the parts, longest first, so the
    pool's queue is a longest-processing-time-first schedule."""
    cost = {k: seconds(k) for g in groups for k in g}
    share = sum(cost.values()) / max(1, workers)
    parts: list[list[Key]] = []
    for group in groups:
        n = min(len(group), max(1, math.ceil(sum(cost[k] for k in group) / share - 1e-9))) if share > 0 else 1
        bins: list[list[Key]] = [[] for _ in range(n)]
        load = [0.0] * n
        for k in sorted(group, key=lambda k: -cost[k]):
            i = load.index(min(load))
            bins[i].append(k)
            load[i] += cost[k]
        parts += bins
    return sorted(parts, key=lambda part: -sum(cost[k] for k in part))


class Evaluator:
    """Memoised predictions of points, computed by ``workers`` processes (1: in this process).

    Use it as a context manager so its workers end with it; the memo (``runs``) may be shared
    by several fits (a calibration's full fit and its folds).
    """

    def __init__(self, decode_tokens: int, *, workers: int = 1, runs: dict[Key, float] | None = None):
        self.decode_tokens = decode_tokens
        self.workers = max(1, int(workers))
        self.runs: dict[Key, float] = {} if runs is None else runs
        self.seconds: dict[str, float] = {}  # point id -> its last run's seconds in a worker
        # point id -> (runs, seconds) over everything computed: where a calibration's time went
        self.spent: dict[str, tuple[int, float]] = {}
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    @staticmethod
    def scoped(point: Mapping[str, Any], values: Mapping[Unknown, float],
               unknowns: list[Unknown] | None = None) -> dict[Unknown, float]:
        """The values that reach ``point`` (its scope decides)."""
        reach = applicable(list(values) if unknowns is None else unknowns, point)
        return {u: values[u] for u in reach if u in values}

    @staticmethod
    def key(point: Mapping[str, Any], values: Mapping[Unknown, float]) -> Key:
        return (str(point["id"]), *sorted((u.name, int(round(v)) if u.integer else float(v))
                                          for u, v in values.items()))

    def ensure(self, requests: Iterable[tuple[Mapping[str, Any], Mapping[Unknown, float]]]) -> None:
        """Compute every requested prediction not yet known (values already scoped to the point)."""
        due: dict[Key, tuple[Mapping[str, Any], Mapping[Unknown, float]]] = {}
        for point, values in requests:
            k = self.key(point, values)
            if k not in self.runs and k not in due:
                due[k] = (point, values)
        if not due:
            return
        if self.workers == 1 or len(due) == 1:
            for k, (point, values) in due.items():
                [(self.runs[k], seconds)] = _predict_many([(point, values)], self.decode_tokens)
                self._book(k[0], seconds)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers,
                                             mp_context=multiprocessing.get_context("spawn"))
        # Jobs that read the same edited trace (same model and trace-preset values) go to one
        # worker, which makes it once and keeps it in memory, unless the group is more than a
        # worker's share (see the module's docstring); the longest parts start first.
        batches: dict[tuple, list[Key]] = {}
        for k, (point, values) in due.items():
            batches.setdefault(self._trace_key(point, values), []).append(k)
        order = balance(list(batches.values()), lambda k: self.seconds.get(k[0], UNMEASURED_S), self.workers)
        futures = [(keys, self._pool.submit(_predict_many, [(dict(due[k][0]), dict(due[k][1])) for k in keys],
                                            self.decode_tokens)) for keys in order]
        for keys, future in futures:
            for k, (value, seconds) in zip(keys, future.result(), strict=True):  # a worker's SimError is raised here
                self.runs[k] = value
                self.seconds[k[0]] = seconds
                self._book(k[0], seconds)

    def _book(self, point_id: str, seconds: float) -> None:
        runs, total = self.spent.get(point_id, (0, 0.0))
        self.spent[point_id] = (runs + 1, total + seconds)

    @staticmethod
    def _trace_key(point: Mapping[str, Any], values: Mapping[Unknown, float]) -> tuple:
        preset = sorted((u.name, float(v)) for u, v in values.items() if u.kind == "preset")
        return (point.get("model"), point.get("preset"), *preset) if preset else ("own", str(point["id"]))

    def get(self, point: Mapping[str, Any], values: Mapping[Unknown, float]) -> float:
        k = self.key(point, values)
        if k not in self.runs:
            self.ensure([(point, values)])
        return self.runs[k]


def predict(point: Mapping[str, Any], values: Mapping[Unknown, float], *, decode_tokens: int) -> float:
    """The point's prediction with ``values`` applied (those in its scope)."""
    from sim.validation import run_point

    overrides = run_overrides(point, values, decode_tokens=decode_tokens)
    row = run_point(dict(point), decode_tokens=decode_tokens, overrides=overrides)
    predicted = float(row["predicted"])
    if not (math.isfinite(predicted) and predicted > 0):
        raise SimError(f"the run gave {predicted} for {point['metric']!r}; a fit needs a positive figure",
                       source=str(point["id"]), field="metric")
    return predicted
