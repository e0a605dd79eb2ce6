"""Where sweep points run: this process, a pool of local processes, or a Dask cluster.

Every executor maps :func:`sim.explore.worker.run_point` over tasks and yields rows as
they finish (in completion order; the store orders them). The runner never depends on
which one ran a point: a task is plain data and ``run_point`` a pure function of it, so
``--workers 1``, ``--workers N`` and Dask give identical rows.

Local processes start with ``forkserver`` (a clean single-threaded server forks each
worker, which is fast and avoids forking a parent whose numerical libraries run threads)
and at most one task per worker is in flight, so when a worker dies (killed by the OS for
memory, a crash in native code) the points it may have held are known: each gets a strike
and is retried alone in a fresh pool, and a point that kills its worker again is recorded
as failed instead of being retried forever.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from sim.checks import check_int
from sim.errors import SimError
from sim.explore.worker import exit_with_parent, run_point

MAX_STRIKES = 2
MAX_WORKERS = 256  # local processes or Dask workers a sweep starts; more is a typo, not a machine
SCHEMES = ("tcp://", "tls://", "ws://", "wss://", "inproc://", "ucx://")


class Executor:
    """Runs tasks and yields result rows as they complete."""

    name = "executor"

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def run(self, tasks: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        raise NotImplementedError


class InProcessExecutor(Executor):
    """One point after another in this process (``--workers 1``)."""

    name = "in-process"

    def run(self, tasks: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for task in tasks:
            yield run_point(task)


class PoolExecutor(Executor):
    """``workers`` local processes; a pool that breaks is replaced (see module docstring)."""

    name = "processes"

    def __init__(self, workers: int):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def _new_pool(self) -> ProcessPoolExecutor:
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(["sim.explore.worker", "sim.engine.simulation"])
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx, initializer=exit_with_parent,
                                   initargs=(os.getpid(),))

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and self._pool is not None:  # interrupted: do not wait for running points
            for proc in list(getattr(self._pool, "_processes", {}).values()):
                proc.terminate()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _drop_pool(self) -> None:
        """Let a broken pool go (its workers are gone or going); the next round starts a fresh one."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def run(self, tasks: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        pending = list(tasks)[::-1]  # pop() from the end keeps submission in task order
        strikes: dict[str, int] = {}
        running: dict[Future, dict[str, Any]] = {}

        def suspect(task: dict[str, Any]) -> bool:
            return strikes.get(task["id"], 0) > 0

        try:
            while pending or running:
                if self._pool is None:
                    self._pool = self._new_pool()
                # A point that was in flight when a worker died runs alone, so that a second
                # death is its own and no innocent neighbour collects a strike with it.
                while pending and len(running) < self.workers and not any(map(suspect, running.values())):
                    if suspect(pending[-1]) and running:
                        break
                    task = pending.pop()
                    try:
                        running[self._pool.submit(run_point, task)] = task
                    except BrokenProcessPool:
                        # A worker died while idle (the OOM killer does not wait for a task to
                        # start): the pool refuses new tasks. This one never ran, so it goes
                        # back without a strike; the points in flight come back broken below.
                        pending.append(task)
                        if not running:
                            self._drop_pool()
                        break
                    if suspect(task):
                        break
                if not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                if not any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                    for fut in done:
                        yield self._result(fut, running.pop(fut))
                    continue
                # The pool broke: keep what finished, strike every point that was in flight.
                for fut, task in list(running.items()):
                    running.pop(fut)
                    if fut.done() and fut.exception() is None:
                        yield fut.result()
                        continue
                    strikes[task["id"]] = strikes.get(task["id"], 0) + 1
                    if strikes[task["id"]] >= MAX_STRIKES:
                        yield _died(task)
                    else:
                        pending.append(task)
                self._drop_pool()
        finally:
            for fut in running:
                fut.cancel()

    @staticmethod
    def _result(fut: Future, task: dict[str, Any]) -> dict[str, Any]:
        exc = fut.exception()
        if exc is None:
            return fut.result()
        return _died(task, f"{type(exc).__name__}: {exc}")  # run_point catches simulation errors: plumbing


class DaskExecutor(Executor):
    """A Dask distributed cluster: a scheduler address, or ``local`` for a LocalCluster.

    The workers need this package installed (same version); they return rows to this
    process, which alone writes the store, so a worker that dies loses nothing written.
    Dask reschedules the tasks of a dead worker itself; a task that kills workers
    repeatedly ends as ``KilledWorker`` and is recorded as failed.
    """

    name = "dask"

    def __init__(self, scheduler: str, workers: int | None = None):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise SimError("Dask is not installed; install the optional extra: pip install 'phonesim[distributed]' "
                           "(or pip install 'dask[distributed]')", field="--scheduler") from None
        self._cluster = None
        if scheduler == "local":
            n = workers or os.cpu_count() or 1
            with _children_ignore_sigint():
                # Warnings of cancelled tasks when a stopped sweep closes the cluster are noise; a
                # point's own failure is reported in its row.
                self._cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                             dashboard_address=None, silence_logs=logging.ERROR)
            self.client = Client(self._cluster)
        else:
            try:
                self.client = Client(scheduler, timeout="20s")
            except OSError as exc:
                raise SimError(f"cannot reach the Dask scheduler {scheduler}: {exc}", field="--scheduler") from None

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def run(self, tasks: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        from distributed import as_completed

        futures = {}
        for task in tasks:
            fut = self.client.submit(run_point, task, key=f"sim-point-{task['id']}", pure=False)
            futures[fut] = task
        try:
            for fut in as_completed(list(futures)):
                task = futures.pop(fut)
                if fut.status == "finished":
                    yield fut.result()
                else:
                    try:
                        fut.result()
                        err = "task did not finish"
                    except Exception as exc:
                        err = f"{type(exc).__name__}: {exc}"
                    yield _died(task, err)
                fut.release()
        finally:
            for fut in futures:
                fut.cancel()


@contextlib.contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Processes started inside inherit an ignored SIGINT (an ignored signal survives exec).

    Ctrl-C reaches every process of the terminal's group: the local Dask workers each
    printed a KeyboardInterrupt traceback while this process was already saving the
    finished rows and closing the cluster, which is how they end.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def check_executor_args(workers: int, scheduler: str | None) -> int:
    """Reject bad options before anything starts (no half-drawn progress bar, no store);
    returns ``workers`` as a Python int."""
    workers = check_int(workers, "--workers", 1, MAX_WORKERS)
    if scheduler is not None and not isinstance(scheduler, str):
        raise SimError(f"expected a scheduler address such as tcp://host:8786 or 'local', got "
                       f"{type(scheduler).__name__}", field="--scheduler")
    if scheduler is not None and scheduler != "local" and not scheduler.startswith(SCHEMES):
        raise SimError(f"expected a scheduler address such as tcp://host:8786, got {scheduler!r}",
                       field="--scheduler")
    return workers


def make_executor(workers: int = 1, scheduler: str | None = None) -> Executor:
    check_executor_args(workers, scheduler)
    if scheduler is not None:
        return DaskExecutor(scheduler, workers if scheduler == "local" else None)
    return InProcessExecutor() if workers == 1 else PoolExecutor(workers)


def _died(task: dict[str, Any], why: str | None = None) -> dict[str, Any]:
    import time

    return {"point_id": task["id"], "status": "failed",
            "error": why or "the worker process died while running this point (killed for memory? a crash?); "
                            "it was retried once", "wall_s": float("nan"), "finished_at": time.time(),
            "worker": "?"}
