"""Run a sweep: expand the spec, skip finished points, run the rest anywhere, store every row.

``run_sweep(spec, "results.parquet", workers=4)`` is what ``sim sweep`` calls. Every
point's options are checked before any runs (:mod:`sim.explore.point_checks`), so bad input is
one error naming the spec field, not a results file of failed rows. Points are
identified by the hash of their resolved configuration (:mod:`sim.explore.spec`); the
store (:mod:`sim.explore.store`) makes each finished row durable within about a second,
so running the same command again after a crash, a SIGKILL, Ctrl-C or SIGTERM runs only
the points that have no row yet, and the compacted result never holds a point twice.
Ctrl-C and SIGTERM also merge the finished rows into the results file before stopping.

The result is one tidy DataFrame, a row per point: ``point_id``, ``status`` (``ok`` or
``failed``), ``error``, the spec's axis columns, the configuration (device, model,
strategy, run options, ``knobs.<name>``), every summary metric (nested ones flattened as
``memory.neuron_cache``, ``phases_ms_per_token.ffn`` ...) and run metadata
(``project_version``, ``device_hash``, ``model_hash``, and the timing columns ``wall_s``,
``finished_at`` and ``worker``, the only ones that differ between two runs of a point).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.checks import check_bool
from sim.errors import SimError
from sim.explore.executors import Executor, check_executor_args, make_executor
from sim.explore.point_checks import check_points
from sim.explore.spec import Point, SweepSpec, expand, load_spec, spec_from_mapping
from sim.explore.store import FLUSH_INTERVAL_S, ResultStore
from sim.explore.worker import TIMING_COLUMNS
from sim.outputs import check_output

__all__ = ["TIMING_COLUMNS", "SweepInterrupted", "SweepReport", "run_points", "run_sweep", "spec_points"]


@dataclass
class SweepReport:
    """What a sweep run did (the rows themselves are in ``results``)."""

    out: Path
    total: int  # distinct points in the spec
    skipped: int  # already in the store
    ran: int
    failed: int  # failed rows among the spec's points (this run or earlier)
    wall_s: float
    results: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    first_error: str | None = None


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by SIGINT (Ctrl-C) or SIGTERM, after its finished rows were saved.

    A KeyboardInterrupt, so code that stops on Ctrl-C stops on it too; ``kept`` points of
    ``total`` have a row in ``out`` and running the same sweep again runs only the rest.
    """

    def __init__(self, signum: int, out: Path | None = None, kept: int = 0, total: int = 0):
        self.signum = signum
        self.out = out
        self.kept = kept
        self.total = total
        # The fields are the args: code that re-raises ``type(exc)(*exc.args)`` (simpy does,
        # for an exception inside a process) gets the same exception back.
        super().__init__(signum, out, kept, total)

    def __str__(self) -> str:
        return self.message

    @property
    def message(self) -> str:
        if self.out is None:  # stopped before the sweep could count its rows
            return "interrupted; run the same command again to resume"
        return (f"interrupted: {self.kept} of {self.total} points kept in {self.out}; "
                "run the same command again to resume")

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + self.signum


def spec_points(spec: SweepSpec | str | Path, base_dir: Path | None = None) -> tuple[list[Point], str]:
    """The spec's distinct points (first occurrence of each id wins) and its source name."""
    if isinstance(spec, str | Path):
        spec_obj, folder = load_spec(spec)
        source, base_dir = str(spec), folder
    elif isinstance(spec, SweepSpec):
        spec_obj, source = spec, spec.name or "spec"
    elif isinstance(spec, dict):
        spec_obj = spec_from_mapping(spec)
        source = spec_obj.name or "spec"
    else:
        raise SimError(f"expected a spec file, a mapping or a SweepSpec, got {type(spec).__name__}", field="spec")
    points = expand(spec_obj, base_dir, source)
    seen: set[str] = set()
    unique = []
    for p in points:
        if p.id not in seen:
            seen.add(p.id)
            unique.append(p)
    return unique, source


def run_sweep(spec: SweepSpec | str | Path, out: str | Path, *, workers: int = 1, scheduler: str | None = None,
              retry_failed: bool = False, prune: bool = False, progress: bool = True,
              base_dir: Path | None = None, on_row: Callable[[dict[str, Any]], None] | None = None,
              commit_every_s: float = FLUSH_INTERVAL_S) -> SweepReport:
    """Run every point of ``spec`` that ``out`` does not hold yet; returns the compacted results.

    Every point's options are checked first (:mod:`sim.explore.point_checks`): bad input raises
    a SimError naming the spec field before anything runs or is written. Finished rows
    become durable at most ``commit_every_s`` seconds apart (0: every row its own part
    file); a crash loses at most the rows finished since the last commit. SIGINT and (in
    the main thread) SIGTERM save every finished row into ``out`` and raise
    :class:`SweepInterrupted`.
    """
    t0 = time.perf_counter()
    workers = check_executor_args(workers, scheduler)
    for name, flag in (("retry_failed", retry_failed), ("prune", prune), ("progress", progress)):
        check_bool(flag, name)
    if on_row is not None and not callable(on_row):
        raise SimError(f"must be a function of one row, or None; got {type(on_row).__name__}", field="on_row")
    if not isinstance(out, str | Path):
        raise SimError(f"expected a results path (.parquet), got {type(out).__name__}", field="out")
    check_output(Path(out), "--out", suffixes=(".parquet",))
    if isinstance(commit_every_s, bool) or not isinstance(commit_every_s, numbers.Real) \
            or not 0 <= commit_every_s < math.inf:
        raise SimError(f"must be a finite number of seconds >= 0, got {commit_every_s!r}", field="--commit-every")
    points, source = spec_points(spec, base_dir)
    check_points(points, source)
    axes = axes_frame(points)
    with _Signals() as signals, ResultStore(out, flush_interval_s=commit_every_s) as store:
        stopped: int | None = None
        todo, ran = points, 0
        try:
            todo, failed_before = _todo(store.load(), points, retry_failed)
            ran = _run(store, todo, len(points), failed_before, workers, scheduler, progress, on_row)
        except KeyboardInterrupt as exc:  # keep what finished, readable in the results file, then stop
            stopped = exc.signum if isinstance(exc, SweepInterrupted) else signal.SIGINT
        with signals.deferred():  # a signal now would leave the finished rows unmerged
            results = store.compact(axes, prune=prune and stopped is None)
        stopped = stopped or signals.pending
        notes = list(store.notes)
    mine = results[results["point_id"].isin(set(axes["point_id"]))]
    if len(results) > len(mine):  # kept on purpose (resume, several specs, one file), but not silently
        notes.append(f"{Path(out).name} also holds {len(results) - len(mine)} rows of points not in this spec "
                     "(an earlier spec or other settings); plots of the file include them; --prune drops them")
    if stopped is not None:
        raise SweepInterrupted(stopped, Path(out), len(mine), len(points))
    failed = mine[mine["status"] != "ok"]
    return SweepReport(Path(out), len(points), len(points) - len(todo), ran, len(failed),
                       time.perf_counter() - t0, results, notes,
                       None if failed.empty else str(failed["error"].iloc[0]))


def _todo(stored: pd.DataFrame, points: list[Point], retry_failed: bool) -> tuple[list[Point], int]:
    """The points without a row (or with a failed one, when retrying), in run order, and the
    number of the spec's points already recorded as failed."""
    ok = set(stored.loc[stored["status"] == "ok", "point_id"]) if "status" in stored else set()
    failed_ids = set(stored["point_id"]) - ok
    done = ok if retry_failed else ok | failed_ids
    todo = [p for p in points if p.id not in done]
    failed_before = 0 if retry_failed else sum(p.id in failed_ids for p in points)
    # Points sharing a trace run back to back, so each worker's trace cache hits.
    first_seen: dict[tuple, int] = {}
    for p in todo:
        first_seen.setdefault(p.trace_key, len(first_seen))
    todo.sort(key=lambda p: first_seen[p.trace_key])
    return todo, failed_before


def _run(store: ResultStore, todo: list[Point], total: int, failed_before: int, workers: int,
         scheduler: str | None, progress: bool, on_row: Callable[[dict[str, Any]], None] | None) -> int:
    """Run ``todo``, appending each row to ``store`` as it finishes; returns how many ran."""
    ran = 0
    with _Progress(total, total - len(todo), failed_before, enabled=progress) as bar:
        if todo:
            with make_executor(workers, scheduler) as ex:
                for row in run_points(ex, todo):
                    store.append(row)
                    ran += 1
                    bar.advance(failed=row["status"] != "ok")
                    if on_row is not None:
                        on_row(row)
    return ran


class _Signals:
    """How a sweep stops: SIGTERM like Ctrl-C while points run, neither while rows are merged.

    While the sweep runs, SIGTERM (``kill``, a batch scheduler ending a job) raises
    :class:`SweepInterrupted` the way Ctrl-C raises KeyboardInterrupt, so the finished rows
    are saved. While they are being merged into the results file (:meth:`deferred`) both
    signals are only noted in ``pending``; the sweep stops right after. The previous
    handlers come back on exit. Handlers belong to the main thread, so elsewhere (and where
    SIGTERM is ignored) nothing changes.
    """

    def __init__(self) -> None:
        self.pending: int | None = None
        self._deferring = False
        self._active = threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if self._active and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: object) -> None:
        if self._deferring:
            self.pending = self.pending or signum
            return
        raise SweepInterrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals arriving inside the block are noted in ``pending`` instead of raised."""
        if not self._active:
            yield
            return
        previous_int = signal.signal(signal.SIGINT, self._handle)
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            signal.signal(signal.SIGINT, previous_int)


def run_points(ex: Executor, points: list[Point]) -> Iterator[dict[str, Any]]:
    """Rows of ``points`` as they finish: measured columns joined with each point's own."""
    by_id = {p.id: p for p in points}
    for row in ex.run([p.task for p in points]):
        yield complete_row(by_id[row["point_id"]], row)


def complete_row(point: Point, measured: dict[str, Any]) -> dict[str, Any]:
    row = {"point_id": point.id, "status": measured["status"], "error": measured.get("error")}
    row.update(point.axes)
    row.update(point.columns)
    row.update({k: v for k, v in measured.items() if k not in row or k in ("status", "error")})
    return row


def axes_frame(points: list[Point]) -> pd.DataFrame:
    """``point_id`` plus the spec's axis columns, one row per point in spec order."""
    from sim.explore.resolve import cell

    cols: list[str] = []
    for p in points:
        for k in p.axes:
            if k not in cols:
                cols.append(k)
    data = [{"point_id": p.id, **{k: cell(p.axes.get(k)) for k in cols}} for p in points]
    return pd.DataFrame(data, columns=["point_id", *cols])


class _Progress:
    """A rich progress bar with ETA on stderr (silent when disabled)."""

    def __init__(self, total: int, done: int, failed: int, enabled: bool):
        self.enabled = enabled and total > 0
        self.failed = failed
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                                  TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True))
        self._task = self._progress.add_task("sweep", total=total, completed=done, failed=failed)

    def __enter__(self) -> _Progress:
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._progress.stop()

    def advance(self, failed: bool = False) -> None:
        self.failed += int(failed)
        if self.enabled:
            self._progress.update(self._task, advance=1, failed=self.failed)
