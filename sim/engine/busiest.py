"""The busiest resource of a run's decode, read from what the run already reports.

A stand-in for a bottleneck analysis, kept in one function so that one can replace it:
a decode token's time is the sum of its phases, and the resource busy for the largest
share of it is the one a faster part would shorten most. The run's ``utilisation`` gives
each unit's busy share of the decode; the compute threads are one resource (the pool:
their mean share, since a phase waits for all of them), the I/O threads and the storage
queue are one (flash: their busiest), each accelerator is its own. It says nothing about
DRAM bandwidth, which the CPU's share then includes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from sim.engine.unit_labels import unit_kind


def _resource(unit: str) -> str:
    kind, _ = unit_kind(unit)
    if kind.startswith("cpu:"):
        return "cpu"
    if kind.startswith("io:") or kind == "storage":
        return "flash"
    return kind


def busiest_resource(summary: Mapping[str, Any]) -> tuple[str, float]:
    """(resource, its busy share of the decode): ``("flash", 0.71)``; ``("-", 0.0)`` when the
    run reports no utilisation (the analytic mode)."""
    shares: dict[str, list[float]] = defaultdict(list)
    for unit, share in (summary.get("utilisation") or {}).items():
        shares[_resource(unit)].append(float(share))
    if not shares:
        return "-", 0.0
    busy = {name: (sum(v) / len(v) if name == "cpu" else max(v)) for name, v in shares.items()}
    name = max(busy, key=lambda n: busy[n])
    return name, busy[name]
