"""Flash read throughput, measured on a test file with the page cache out of the way.

A device profile's storage section is throughput curves (by request size, sequential and
random), the span effect, the queue depth and the rate each core reaches when it issues
the reads. All of it comes from one primitive, :func:`measure_reads`: ``readers`` threads,
each with its own descriptor and one request in flight (blocking ``preadv``, which drops
the GIL), read ``block``-byte requests for ``duration_s`` seconds, optionally pinned to
given CPUs. Concurrent readers are how a queue depth is reached with the standard library
alone (no io_uring binding ships with Python); fio's ``psync`` engine with ``numjobs``
does the same.

The figures are only the flash's if no read is served from DRAM, so :func:`cache_bypass`
picks the first method that works on the test file's filesystem: ``O_DIRECT`` (Linux,
Android), ``F_NOCACHE`` (macOS), a test file larger than the memory left free, or
``posix_fadvise(DONTNEED)`` dropping the file's cached pages before each measurement and
every 64 MiB read. The profile records which one was used.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SimError
from sim.profiling.topology import pinned

KiB = 1024
MiB = 1024 * KiB
PROBE_PREFIX = ".phonesim-profile-"  # the test file's name starts so: easy to spot if a SIGKILL left one
WRITE_CHUNK = 8 * MiB
DROP_EVERY_BYTES = 64 * MiB  # posix_fadvise method: cached pages are dropped this often per reader

O_DIRECT = "O_DIRECT"
F_NOCACHE = "F_NOCACHE"
LARGER_THAN_MEMORY = "test file larger than free memory"
FADVISE = "posix_fadvise(DONTNEED)"


@dataclass(frozen=True)
class ReadResult:
    """What ``readers`` concurrent readers achieved together."""

    gbps: float  # bytes read over the wall-clock time from the first start to the last stop, in GB/s
    latency_us: float  # mean time one request took, as one reader saw it
    requests: int


def available_memory_bytes() -> int | None:
    """Memory the kernel could give without swapping (``MemAvailable``), where it says."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def drop_cached(path: Path) -> None:
    """Ask the kernel to forget the file's cached pages (no-op where unsupported)."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class ProbeFile:
    """The test file, created in ``folder`` and removed when the ``with`` block ends, even on
    Ctrl-C or an error (``mkstemp`` picks a fresh name, so no existing file is touched)."""

    def __init__(self, folder: Path, size_bytes: int):
        self.folder = Path(folder)
        self.size_bytes = int(size_bytes)
        self.path: Path | None = None

    def __enter__(self) -> ProbeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def create(self, progress: Callable[[int], None] | None = None, seed: int = 0) -> Path:
        """Write ``size_bytes`` of random bytes (incompressible, so no device can shortcut the
        reads), flush them to the device and drop them from the page cache."""
        fd, name = tempfile.mkstemp(prefix=PROBE_PREFIX, suffix=".bin", dir=self.folder)
        self.path = Path(name)
        rng = np.random.default_rng(seed)
        try:
            written = 0
            while written < self.size_bytes:
                chunk = rng.bytes(min(WRITE_CHUNK, self.size_bytes - written))
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                written += len(chunk)
                if progress is not None:
                    progress(len(chunk))
            os.fsync(fd)
        finally:
            os.close(fd)
        drop_cached(self.path)
        return self.path

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.path = None


def _direct_works(path: Path) -> bool:
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, 4 * KiB)  # page-aligned, as O_DIRECT requires
        return os.preadv(fd, [buf], 0) == 4 * KiB
    except OSError:
        return False
    finally:
        os.close(fd)


def cache_bypass(path: Path, size_bytes: int, folder_flag: str = "--storage-path") -> str:
    """The first way of keeping the page cache out of the reads that works on ``path``."""
    if _direct_works(path):
        return O_DIRECT
    try:
        import fcntl
    except ImportError:  # Windows
        fcntl = None  # type: ignore[assignment]
    if fcntl is not None and hasattr(fcntl, "F_NOCACHE"):
        return F_NOCACHE
    free = available_memory_bytes()
    if free is not None and size_bytes > free:
        return LARGER_THAN_MEMORY
    if hasattr(os, "posix_fadvise"):
        return FADVISE
    raise SimError(f"the filesystem of {path.parent} allows neither O_DIRECT nor F_NOCACHE nor posix_fadvise, "
                   "so reads would come from DRAM; give a folder on another filesystem, or --max-bytes above "
                   "the free memory", field=folder_flag)


def _open(path: Path, method: str) -> int:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if method == O_DIRECT else 0))
    if method == F_NOCACHE:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_NOCACHE, 1)
    return fd


def _offsets(pattern: str, reader: int, readers: int, slots: int, rng: np.random.Generator):
    """Endless request offsets (in blocks) for one reader: random over the span, or a
    sequential walk through the reader's own share of it."""
    if pattern == "rand":
        while True:
            yield from rng.integers(0, slots, 256).tolist()
    share = max(1, slots // readers)
    start = (reader * share) % slots
    while True:
        yield from range(start, min(start + share, slots))


def measure_reads(path: Path, method: str, *, block: int, span: int, pattern: str = "rand", readers: int = 1,
                  duration_s: float = 0.5, cpus_per_reader: Sequence[Sequence[int] | None] | None = None,
                  seed: int = 0) -> ReadResult:
    """``readers`` threads read ``block``-byte requests from the first ``span`` bytes of ``path``
    for ``duration_s`` seconds (``pattern`` "rand" or "seq"), each pinned to
    ``cpus_per_reader[i]`` if given. Offsets are multiples of ``block``."""
    if pattern not in ("rand", "seq"):
        raise ValueError(f"pattern must be rand or seq, got {pattern!r}")
    slots = max(1, min(span, path.stat().st_size) // block)
    if method == FADVISE:
        drop_cached(path)
    # Several readers run as processes where fork exists: threads of one interpreter hand the
    # GIL to each other after every request, which halved the rate at depth 32 against fio's
    # 32 psync jobs here. One reader runs in this process (pinning a thread is what a
    # per-cluster figure needs).
    ctx = multiprocessing.get_context("fork") if readers > 1 and hasattr(os, "fork") else None
    barrier = ctx.Barrier(readers + 1) if ctx else threading.Barrier(readers + 1)
    halt = ctx.Event() if ctx else threading.Event()
    results = ctx.Queue() if ctx else None
    spans: list[tuple[float, float, int, int] | None] = [None] * readers
    errors: list[BaseException] = []

    def work(i: int) -> None:
        cpus = cpus_per_reader[i] if cpus_per_reader else None
        try:
            with pinned(tuple(cpus) if cpus else None):
                fd = _open(path, method)
                try:
                    buf = mmap.mmap(-1, block)
                    slot_offsets = _offsets(pattern, i, readers, slots, np.random.default_rng([seed, i]))
                    bufs = [buf]
                    preadv, clock = os.preadv, time.perf_counter
                    barrier.wait()
                    start = clock()
                    deadline = start + duration_s
                    done = moved = since_drop = 0
                    for slot in slot_offsets:
                        got = preadv(fd, bufs, slot * block)
                        moved += got
                        done += 1
                        if method == FADVISE:
                            since_drop += got
                            if since_drop >= DROP_EVERY_BYTES:
                                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                                since_drop = 0
                        if not done & 7 and (halt.is_set() or clock() >= deadline):
                            break
                    span_i = (start, clock(), done, moved)
                    if results is not None:
                        results.put((i, span_i, None))
                    else:
                        spans[i] = span_i
                finally:
                    os.close(fd)
        except threading.BrokenBarrierError:
            if results is not None:
                results.put((i, None, None))
        except BaseException as exc:  # reported by the caller
            if results is not None:
                results.put((i, None, OSError(getattr(exc, "errno", None), str(exc))))
            else:
                errors.append(exc)
            barrier.abort()

    if ctx is not None:
        workers = [ctx.Process(target=_exit_after, args=(work, i, results), daemon=True) for i in range(readers)]
    else:
        workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(readers)]
    for w in workers:
        w.start()
    try:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        if results is not None:
            for _ in range(readers):
                i, span_i, exc = results.get(timeout=duration_s + 60)
                spans[i] = span_i
                if exc is not None:
                    errors.append(exc)
        for w in workers:
            while w.is_alive():
                w.join(0.05)
    except BaseException:  # Ctrl-C: stop the readers before the caller removes their file
        halt.set()
        barrier.abort()
        for w in workers:
            w.join()
        raise
    if errors:
        exc = errors[0]
        if isinstance(exc, OSError):
            raise SimError(f"reading the test file failed: {exc.strerror or exc}", source=str(path)) from None
        raise exc
    finished = [s for s in spans if s is not None]
    wall = max(s[1] for s in finished) - min(s[0] for s in finished)
    requests = sum(s[2] for s in finished)
    moved = sum(s[3] for s in finished)
    latency = float(np.mean([(s[1] - s[0]) / max(s[2], 1) for s in finished]))
    return ReadResult(gbps=moved / wall / 1e9 if wall > 0 else 0.0, latency_us=latency * 1e6, requests=requests)


def _exit_after(work: Callable[[int], None], i: int, results: Any) -> None:
    """A forked reader: run, flush its result to the parent, then leave at once (no atexit
    handlers of the parent's libraries)."""
    try:
        work(i)
        results.close()
        results.join_thread()
    finally:
        os._exit(0)


def best_of(repeats: int, measure: Callable[[], ReadResult]) -> ReadResult:
    """The fastest of ``repeats`` runs: on a shared machine the others lost time to noise."""
    return max((measure() for _ in range(max(1, repeats))), key=lambda r: r.gbps)


@dataclass(frozen=True)
class BlockDevice:
    """What sysfs says about the device holding a file (all None where it says nothing)."""

    name: str | None = None
    logical_block_bytes: int | None = None
    hw_queues: int | None = None  # blk-mq hardware queues: UFS has 1, NVMe one per core or so


def block_device(path: Path) -> BlockDevice:
    """The block device under ``path`` (its whole disk, not the partition), from sysfs."""
    try:
        st = os.stat(path)
        node = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve(strict=True)
    except (OSError, AttributeError):
        return BlockDevice()
    if (node / "partition").exists():
        node = node.parent
    lbs: int | None = None
    with contextlib.suppress(OSError, ValueError):
        lbs = int((node / "queue" / "logical_block_size").read_text())
    queues: int | None = None
    if (node / "mq").is_dir():
        queues = sum(1 for p in (node / "mq").iterdir() if p.is_dir()) or None
    return BlockDevice(node.name, lbs, queues)
