"""The CPU's clusters as the OS describes them, and pinning a thread to one of them.

Phones group cores into clusters of one micro-architecture and clock (big, mid, little);
Linux exposes each core's relative capacity (``cpu_capacity``) and its clock domain's
highest frequency (``cpufreq/cpuinfo_max_freq``) under ``/sys/devices/system/cpu``. Cores
with the same pair form a cluster, which is how the engine's profiles group them. Where
sysfs says nothing (macOS, a container hiding it) every core the process may use is one
cluster, and the profile says so.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Cluster:
    """Cores of one kind: ``cpus`` are the OS's CPU numbers."""

    name: str
    cpus: tuple[int, ...]
    capacity: int | None = None  # Linux's relative capacity (1024 = the fastest core), if exposed
    max_freq_ghz: float | None = None  # the clock domain's highest frequency, if exposed
    sources: tuple[str, ...] = field(default=())  # where capacity and frequency came from


@dataclass(frozen=True)
class Topology:
    clusters: tuple[Cluster, ...]
    method: str  # how the clusters were found, for the profile's comments
    can_pin: bool  # whether threads can be pinned (os.sched_setaffinity)
    cpu_model: str = ""

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(c for cl in self.clusters for c in cl.cpus)


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,6`` (the sysfs list format) -> [0, 1, 2, 3, 6]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cluster_names(count: int) -> list[str]:
    """Names by rank, fastest first: the words the bundled profiles use where they fit."""
    if count == 1:
        return ["cpu"]
    if count == 2:
        return ["big", "little"]
    if count == 3:
        return ["big", "mid", "little"]
    return ["big", *[f"mid{i}" for i in range(1, count - 1)], "little"]


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (a container or `taskset` may restrict them)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _cpu_model() -> str:
    text = _read(Path("/proc/cpuinfo")) or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def cpuinfo_ghz() -> float | None:
    """The highest current clock /proc/cpuinfo reports (``cpu MHz``), where cpufreq is hidden."""
    text = _read(Path("/proc/cpuinfo")) or ""
    values = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                values.append(float(value))
            except ValueError:
                continue
    return max(values) / 1e3 if values and max(values) > 0 else None


def read_topology(root: Path = SYSFS_CPU) -> Topology:
    """Group the usable CPUs into clusters by (capacity, max frequency), fastest first."""
    cpus = allowed_cpus()
    keys: dict[int, tuple[int | None, float | None]] = {}
    found: set[str] = set()
    for cpu in cpus:
        base = root / f"cpu{cpu}"
        cap_text = _read(base / "cpu_capacity")
        freq_text = _read(base / "cpufreq" / "cpuinfo_max_freq")
        capacity = int(cap_text) if cap_text and cap_text.isdigit() else None
        freq = int(freq_text) / 1e6 if freq_text and freq_text.isdigit() else None  # kHz -> GHz
        if capacity is not None:
            found.add("cpu_capacity")
        if freq is not None:
            found.add("cpuinfo_max_freq")
        keys[cpu] = (capacity, freq)
    groups: dict[tuple[int | None, float | None], list[int]] = {}
    for cpu in cpus:
        groups.setdefault(keys[cpu], []).append(cpu)
    ordered = sorted(groups.items(), key=lambda kv: (-(kv[0][0] or 0), -(kv[0][1] or 0.0), kv[1][0]))
    names = cluster_names(len(ordered))
    sources = tuple(sorted(found))
    clusters = tuple(Cluster(name, tuple(members), key[0], key[1], sources)
                     for name, (key, members) in zip(names, ordered, strict=True))
    if found:
        method = f"sysfs {root} ({', '.join(sources)})"
    else:
        method = "one cluster of every usable core (the OS exposes no cpu_capacity or cpufreq)"
    return Topology(clusters, method, hasattr(os, "sched_setaffinity"), _cpu_model())


@contextmanager
def pinned(cpus: tuple[int, ...] | list[int] | None) -> Iterator[bool]:
    """Run the calling thread on ``cpus`` for the block (Linux: affinity is per thread).

    Yields whether it is pinned: on a system without ``sched_setaffinity`` (macOS) the
    block runs where the scheduler puts it, and callers record that in their method.
    """
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield False
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield True
    finally:
        os.sched_setaffinity(0, before)
