"""Timelines of a run as Chrome/Perfetto trace-event JSON (the Gantt chart is sim.plots.draw_gantt).

Spans come from :class:`~sim.engine.machine.Machine` when a run records them: one track
per compute thread, I/O thread, NPU/GPU and the storage queue, so a user can see in
ui.perfetto.dev whether flash reads hide behind compute.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.engine.machine import Span


def perfetto_events(spans: list[Span]) -> list[dict[str, object]]:
    units = sorted({s.unit for s in spans}, key=_unit_order)
    tid = {u: i + 1 for i, u in enumerate(units)}
    events: list[dict[str, object]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "simulated device"}}]
    for unit in units:
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[unit], "args": {"name": unit}})
    for s in spans:
        events.append({"name": s.name, "cat": s.unit.split(":")[0], "ph": "X", "pid": 1, "tid": tid[s.unit],
                       "ts": s.start_s * 1e6, "dur": max(0.0, (s.end_s - s.start_s) * 1e6),
                       "args": {"token": s.token}})
    return events


def write_perfetto(spans: list[Span], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": perfetto_events(spans), "displayTimeUnit": "ms"}))
    return path


def _unit_order(unit: str) -> tuple[int, str]:
    for i, prefix in enumerate(("cpu", "npu", "gpu", "io", "storage")):
        if unit.startswith(prefix):
            return i, unit
    return 9, unit
