"""Which microbenchmarks `sim profile-device` runs, in what order, and what they found.

:func:`plan` turns the options into :class:`Settings` (``--quick`` trades sizes and
repetitions for a run well under a minute); :func:`measure` runs every step, reporting each
to a progress callback, and returns :class:`Measurements` for :mod:`sim.profiling.writer`.
The test file lives only inside :func:`measure`'s ``with`` block, so it is removed however
the run ends.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import SimError
from sim.profiling import cpu, dram, storage
from sim.profiling.storage import KiB, MiB, ReadResult
from sim.profiling.topology import Topology, read_topology

SPAN_BYTES = 128 * MiB  # [PI2 §2.3]'s small span for random reads; range_effect compares the whole file to it
FULL_DEPTH = 32  # readers for "full queue" figures: UFS's 32-entry queue, fio's usual iodepth
MIN_FILE_BYTES = 1 * MiB  # the largest request the curves measure
DISK_MARGIN_BYTES = 256 * MiB  # left free on the filesystem after the test file is written


@dataclass(frozen=True)
class Settings:
    quick: bool
    storage_dir: Path
    file_bytes: int
    measure_s: float  # per storage measurement
    repeats: int  # storage measurements keep the best of this many
    blocks: tuple[int, ...]
    depths: tuple[int, ...]
    dram_passes: int
    kernel_s: float  # per CPU kernel


def plan(storage_dir: Path, max_bytes: int, *, quick: bool, measure_s: float | None = None) -> Settings:
    """Settings for a run, after checking the folder and the size against the filesystem."""
    if not storage_dir.is_dir():
        raise SimError("is not a folder; give an existing folder on the storage to measure",
                       source=str(storage_dir), field="--storage-path")
    if not os.access(storage_dir, os.W_OK):
        raise SimError("is not writable; the test file is written there", source=str(storage_dir),
                       field="--storage-path")
    if max_bytes < MIN_FILE_BYTES:
        raise SimError(f"must be at least 1MiB (the largest request measured), got {max_bytes} bytes",
                       field="--max-bytes")
    file_bytes = min(max_bytes, 256 * MiB) if quick else max_bytes
    file_bytes -= file_bytes % MiB  # whole 1 MiB requests
    free = shutil.disk_usage(storage_dir).free
    if file_bytes + DISK_MARGIN_BYTES > free:
        raise SimError(f"a {file_bytes / 1e9:.2f} GB test file would leave less than 256 MiB free on "
                       f"{storage_dir} ({free / 1e9:.2f} GB free); give a smaller size", field="--max-bytes")
    if measure_s is not None and not 0.01 <= measure_s <= 60:
        raise SimError(f"must be within 0.01..60 seconds, got {measure_s}", field="--measure-s")
    if quick:
        return Settings(True, storage_dir, file_bytes, measure_s or 0.25, 1, (4 * KiB, 64 * KiB, MiB),
                        (1, 4, FULL_DEPTH), 3, min(measure_s or 0.1, 0.1))
    return Settings(False, storage_dir, file_bytes, measure_s or 1.0, 2,
                    (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB), (1, 2, 4, 8, 16, FULL_DEPTH, 64), 6,
                    min(measure_s or 0.3, 0.3))


@dataclass
class Measurements:
    """Everything measured, keyed as the writer needs it (sizes in bytes, rates in GB/s)."""

    date: str
    settings: Settings
    topology: Topology
    bypass: str = ""
    block_device: storage.BlockDevice = field(default_factory=storage.BlockDevice)
    seq: dict[int, ReadResult] = field(default_factory=dict)  # by request size, one reader
    rand: dict[int, ReadResult] = field(default_factory=dict)  # by request size, FULL_DEPTH readers, SPAN_BYTES
    spans: dict[int, ReadResult] = field(default_factory=dict)  # 4 KiB random at FULL_DEPTH, by span
    depths: dict[int, ReadResult] = field(default_factory=dict)  # 4 KiB random over SPAN_BYTES, by readers
    cluster_io: dict[str, ReadResult] = field(default_factory=dict)  # 4 KiB random issued from one core
    spread_io: ReadResult | None = None  # 4 KiB random issued from every core at once
    dram_copy: dict[int, dram.StreamResult] = field(default_factory=dict)  # by thread count
    dram_triad: dict[int, dram.StreamResult] = field(default_factory=dict)
    dram_cluster: dict[str, dram.StreamResult] = field(default_factory=dict)  # one thread on the cluster
    kernels: dict[str, cpu.KernelRates] = field(default_factory=dict)
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    disk_total_bytes: int | None = None

    @property
    def span(self) -> int:
        return min(SPAN_BYTES, self.settings.file_bytes)


def _mem_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _dram_array_bytes(threads: int) -> int:
    available = storage.available_memory_bytes() or 2 * 1024 * MiB
    budget = min(1536 * MiB, available // 4)
    return max(32 * MiB, min(256 * MiB, budget // (3 * threads)))


Step = tuple[str, Callable[[], None]]


def steps(m: Measurements, probe: storage.ProbeFile) -> list[Step]:
    """The run, one step per measurement, in order (the first writes the test file)."""
    s = m.settings
    topo = m.topology
    cpus = list(topo.cpus)
    pin = topo.can_pin

    def reads(**kw: object) -> Callable[[], ReadResult]:
        assert probe.path is not None
        path = probe.path
        return lambda: storage.best_of(s.repeats, lambda: storage.measure_reads(
            path, m.bypass, duration_s=s.measure_s, **kw))  # type: ignore[arg-type]

    def create() -> None:
        probe.create()
        assert probe.path is not None
        m.bypass = storage.cache_bypass(probe.path, s.file_bytes)
        m.block_device = storage.block_device(probe.path)

    out: list[Step] = [(f"writing a {s.file_bytes / 1e6:.0f} MB test file", create)]
    for block in s.blocks:
        out.append((f"sequential read, {block // KiB} KiB",
                    lambda b=block: m.seq.__setitem__(b, reads(block=b, span=s.file_bytes, pattern="seq")())))
        out.append((f"random read, {block // KiB} KiB, {FULL_DEPTH} readers",
                    lambda b=block: m.rand.__setitem__(b, reads(block=b, span=m.span, readers=FULL_DEPTH)())))
    for depth in s.depths:
        if depth == FULL_DEPTH:
            continue  # the same measurement as rand[4 KiB]
        out.append((f"random read, 4 KiB, {depth} readers",
                    lambda d=depth: m.depths.__setitem__(d, reads(block=4 * KiB, span=m.span, readers=d)())))
    if s.file_bytes > m.span:
        out.append(("random read, 4 KiB, whole file", lambda: m.spans.__setitem__(
            s.file_bytes, reads(block=4 * KiB, span=s.file_bytes, readers=FULL_DEPTH)())))
    if pin:
        for cl in topo.clusters:
            out.append((f"random read, 4 KiB, issued from {cl.name}", lambda c=cl: m.cluster_io.__setitem__(
                c.name, reads(block=4 * KiB, span=m.span, readers=FULL_DEPTH,
                              cpus_per_reader=[(c.cpus[0],)] * FULL_DEPTH)())))
        if len(cpus) > 1:
            spread = [(cpus[i % len(cpus)],) for i in range(FULL_DEPTH)]
            out.append(("random read, 4 KiB, issued from every core", lambda: setattr(
                m, "spread_io", reads(block=4 * KiB, span=m.span, readers=FULL_DEPTH, cpus_per_reader=spread)())))
    counts = sorted({1, len(cpus)}) if s.quick else list(range(1, len(cpus) + 1))
    for n in counts:
        per = [(cpus[i],) for i in range(n)] if pin else None
        out.append((f"DRAM copy, {n} thread(s)", lambda n=n, per=per: m.dram_copy.__setitem__(n, dram.stream_bandwidth(
            "copy", threads=n, array_bytes=_dram_array_bytes(n), passes=s.dram_passes, cpus_per_thread=per))))
        out.append((f"DRAM triad, {n} thread(s)", lambda n=n, per=per: m.dram_triad.__setitem__(
            n, dram.stream_bandwidth("triad", threads=n, array_bytes=_dram_array_bytes(n), passes=s.dram_passes,
                                     cpus_per_thread=per))))
    for cl in topo.clusters:
        if pin and len(topo.clusters) > 1:
            out.append((f"DRAM copy, one {cl.name} core", lambda c=cl: m.dram_cluster.__setitem__(
                c.name, dram.stream_bandwidth("copy", threads=1, array_bytes=_dram_array_bytes(1),
                                              passes=s.dram_passes, cpus_per_thread=[(c.cpus[0],)]))))
        out.append((f"CPU kernels, one {cl.name} core", lambda c=cl: m.kernels.__setitem__(
            c.name, cpu.kernel_rates((c.cpus[0],) if pin else None, duration_s=s.kernel_s))))
    return out


def measure(settings: Settings, on_step: Callable[[str], None] | None = None,
            on_plan: Callable[[int], None] | None = None) -> Measurements:
    """Run every step; ``on_plan`` hears how many there are, ``on_step`` each one as it starts."""
    m = Measurements(date=dt.date.today().isoformat(), settings=settings, topology=read_topology(),
                     mem_total_bytes=_mem_total(), mem_available_bytes=storage.available_memory_bytes(),
                     disk_total_bytes=shutil.disk_usage(settings.storage_dir).total)
    with storage.ProbeFile(settings.storage_dir, settings.file_bytes) as probe:
        todo = steps(m, probe)
        if on_plan is not None:
            on_plan(len(todo))
        for label, run in todo:
            if on_step is not None:
                on_step(label)
            run()
    for cl in m.topology.clusters:  # one cluster (or no pinning): the one-thread figure is its core's
        m.dram_cluster.setdefault(cl.name, m.dram_copy[1])
    m.depths[FULL_DEPTH] = m.rand[4 * KiB]
    m.spans[m.span] = m.rand[4 * KiB]
    return m
