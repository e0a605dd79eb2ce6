"""Predictions of published points at given unknown values: each computed once, several at a time.

A fit asks for the same (point, values) pair many times (a difference step of one unknown
leaves every point outside its scope where it was; a cross-validation fold revisits the full
fit's first steps), and each new pair is a whole simulation, seconds long. So predictions
are memoised by the point and the values in its scope, and the ones a step needs at once
(the residuals of a trial point, or every column of a Jacobian) run in parallel worker
processes. Workers are started with ``spawn``: the parent may hold threads (the trace
replay's reader), which a forked child would inherit mid-lock.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from sim.calibrate.apply import applicable, run_overrides
from sim.calibrate.unknowns import Unknown
from sim.errors import SimError

Key = tuple


def default_workers() -> int:
    """One worker per core the process may use (2 on the CI machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _predict_many(jobs: list[tuple[Mapping[str, Any], Mapping[Unknown, float]]], decode_tokens: int) -> list[float]:
    return [predict(point, values, decode_tokens=decode_tokens) for point, values in jobs]


class Evaluator:
    """Memoised predictions of points, computed by ``workers`` processes (1: in this process).

    Use it as a context manager so its workers end with it; the memo (``runs``) may be shared
    by several fits (a calibration's full fit and its folds).
    """

    def __init__(self, decode_tokens: int, *, workers: int = 1, runs: dict[Key, float] | None = None):
        self.decode_tokens = decode_tokens
        self.workers = max(1, int(workers))
        self.runs: dict[Key, float] = {} if runs is None else runs
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
                self.runs[k] = predict(point, values, decode_tokens=self.decode_tokens)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers,
                                             mp_context=multiprocessing.get_context("spawn"))
        # Jobs that read the same edited trace (same model and trace-preset values) go to one
        # worker, which makes it once and keeps it in memory; the longest batches start first.
        batches: dict[tuple, list[Key]] = {}
        for k, (point, values) in due.items():
            batches.setdefault(self._trace_key(point, values), []).append(k)
        order = sorted(batches.values(), key=len, reverse=True)
        futures = [(keys, self._pool.submit(_predict_many, [(dict(due[k][0]), dict(due[k][1])) for k in keys],
                                            self.decode_tokens)) for keys in order]
        for keys, future in futures:
            for k, value in zip(keys, future.result(), strict=True):  # a worker's SimError is raised here
                self.runs[k] = value

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
