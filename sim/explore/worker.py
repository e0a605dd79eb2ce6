"""Run one resolved sweep point; the function every executor (in-process, pool, Dask) calls.

:func:`run_point` takes the plain-data task built by :mod:`sim.explore.resolve` (profiles as
dumped mappings, so it pickles small and needs nothing but this package on a worker) and
returns the row's measured columns. It never raises for a failing simulation: the error
becomes the row's ``error`` so one bad point cannot stop a sweep.

Synthetic traces are kept per process: the points of a sweep mostly share a model, preset,
seed and length, and generating a Mixtral-sized trace costs seconds, so each worker
replays one in-memory copy, read from the on-disk trace store (:mod:`sim.traces.store`)
when another worker or an earlier run has made it. The copy is exactly what ``simulate``
would generate itself (same generator, dimensions, token count and seed).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from sim import kernel_cache
from sim.engine.unit_labels import unit_kind
from sim.errors import SimError, interrupt_behind

PARENT_POLL_S = 1.0  # how often a pool worker checks that the sweep's process is still there


def exit_with_parent(parent_pid: int, poll_s: float = PARENT_POLL_S) -> None:
    """Pool-worker initializer: end this worker soon after the process that started the pool.

    A sweep or plan killed outright (SIGKILL, the OOM killer, a batch job's hard limit) runs
    no clean-up, and its workers would otherwise live on, finishing points nobody will store
    and holding the caller's terminal or pipe open. The workers are children of the fork
    server, not of the sweep, so the parent-death signal cannot do this; a thread polls.
    """
    def watch() -> None:
        while True:
            time.sleep(poll_s)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # the pid exists (reused by another user): keep going
                pass

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


# Summary keys that repeat the configuration columns (kept once, from the configuration).
_CONFIG_KEYS = {"device", "model", "strategy", "mode", "seed", "wall_s"}
TIMING_COLUMNS = ("wall_s", "finished_at", "worker")


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """Simulate one point; returns ``point_id``, ``status``, ``error``, metrics and timing."""
    t0 = time.perf_counter()
    row: dict[str, Any] = {"point_id": task["id"], "status": "ok", "error": None}
    try:
        row.update(flatten_summary(_simulate(task).summary))
    except Exception as exc:  # a failing point is data, not a crash of the sweep
        interrupt = interrupt_behind(exc)
        if interrupt is not None:
            raise interrupt from None
        row.update(status="failed", error=error_text(exc))
    row["wall_s"] = time.perf_counter() - t0
    row["finished_at"] = time.time()
    row["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    return row


def _simulate(task: dict[str, Any]) -> Any:
    from sim.engine import simulation as engine
    from sim.explore.resolve import run_config
    from sim.profiles.device import DeviceProfile
    from sim.profiles.model import ModelProfile

    device = DeviceProfile.model_validate(task["device"])
    model = ModelProfile.model_validate(task["model"])
    config = run_config(task, device, model)
    entry = task.get("calibration")
    if entry:  # the point's calibrated values, applied as `sim run` applies them
        from sim.calibrate.apply import calibrated_config
        from sim.calibrate.calibration import from_values

        config = calibrated_config(config, from_values(entry["values"], entry["source"]),
                                   user_paths=tuple(entry.get("user_paths", ())))
    # simulate keeps generated traces between runs, so a worker's points share one trace.
    return engine.simulate(config)


def error_text(exc: BaseException) -> str:
    """One line: a SimError's own message, else the exception type and message."""
    if isinstance(exc, SimError):
        return str(exc)
    repaired = kernel_cache.repair(exc)  # the next point recompiles; --retry-failed reruns this one
    if repaired:
        return repaired
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def flatten_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A run summary as flat columns: nested mappings as ``memory.neuron_cache``, lists joined."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key in _CONFIG_KEYS:
            continue
        if key in ("utilisation", "prefill_utilisation") and isinstance(value, dict):
            out.update(_utilisation_by_kind(value, key))
        elif key.endswith("_ci"):  # an interval: two numeric columns (none when the run had too few tokens)
            if value:
                out[f"{key}.lo"], out[f"{key}.hi"] = _scalar(value[0]), _scalar(value[1])
        elif key == "bottleneck":  # what binds the token: a column to colour a sweep by (--hue bottleneck)
            token = (value or {}).get("token") or {}
            out["bottleneck"] = token.get("resource")
            out["bottleneck.share"] = (token.get("shares") or {}).get(token.get("resource"))
        elif isinstance(value, dict):
            for sub, v in value.items():
                out[f"{key}.{sub}"] = _scalar(v)
        elif isinstance(value, list | tuple):
            out[key] = "; ".join(str(v) for v in value)
        else:
            out[key] = _scalar(value)
    return out


def _utilisation_by_kind(util: dict[str, float], prefix: str = "utilisation") -> dict[str, float]:
    """Mean busy fraction per kind of unit: ``cpu:mid-hi0..2`` -> ``utilisation.cpu:mid-hi``.

    A run has one unit per thread (LLM in a Flash reads with 32 I/O threads); one column per
    thread would make columns depend on thread counts, so threads of one kind are averaged.
    """
    groups: dict[str, list[float]] = {}
    for unit, frac in util.items():
        groups.setdefault(unit_kind(unit)[0], []).append(float(frac))
    return {f"{prefix}.{k}": sum(v) / len(v) for k, v in sorted(groups.items())}


def _scalar(value: Any) -> Any:
    if value is None:
        return float("nan")
    if hasattr(value, "item") and not isinstance(value, str):
        return value.item()
    return value
