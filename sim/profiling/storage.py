"""Flash read throughput, measured on a test file with the page cache out of the way.

A device profile's storage section is throughput curves (by request size, sequential and
random), the span effect, the queue depth and the rate each core reaches when it issues
the reads. All of it comes from one primitive, :func:`measure_reads`: ``readers`` threads,
each with its own descriptor and one request in flight (blocking ``pread`` in a compiled
loop that drops the GIL, :mod:`sim.profiling.preads`), read ``block``-byte requests for
``duration_s`` seconds, optionally pinned to given CPUs. Concurrent readers are how a
queue depth is reached without an io_uring binding (Python ships none, and PyPI has no
well-kept one); fio's ``psync`` engine with ``--numjobs`` threads does the same.

The figures are only the flash's if no read is served from DRAM, so :func:`cache_bypass`
picks the first method that works on the test file's filesystem: ``O_DIRECT`` (Linux,
Android), ``F_NOCACHE`` (macOS), a test file larger than the memory left free, or
``posix_fadvise(DONTNEED)`` dropping the file's cached pages before each measurement and
every 64 MiB read. The profile records which one was used.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import SimError
from sim.profiling.preads import ReadBuffer, read_batch
from sim.profiling.topology import pinned

KiB = 1024
MiB = 1024 * KiB
PROBE_PREFIX = ".phonesim-profile-"  # the test file's name starts so: easy to spot if a SIGKILL left one
WRITE_CHUNK = 8 * MiB
DROP_EVERY_BYTES = 64 * MiB  # posix_fadvise method: cached pages are dropped this often per reader
BATCH_BYTES = 64 * KiB  # bytes a reader requests between two looks at the clock (see batch_size)

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


def _offset_batches(pattern: str, reader: int, readers: int, slots: int, block: int,
                    rng: np.random.Generator, batch: int) -> Iterator[np.ndarray]:
    """Endless batches of ``batch`` request offsets (bytes, int64) for one reader: random
    over the span, or a sequential walk through the reader's own share of it."""
    if pattern == "rand":
        while True:
            yield rng.integers(0, slots, batch, dtype=np.int64) * block
    share = max(1, slots // readers)
    start = (reader * share) % slots
    walk = np.arange(start, min(start + share, slots), dtype=np.int64) * block
    i = 0
    while True:  # around the share again at its end
        yield walk.take(np.arange(i, i + batch), mode="wrap")
        i = (i + batch) % walk.size


def batch_size(block: int) -> int:
    """Requests per compiled batch: about 64 KiB of 4 KiB reads, one at 64 KiB and more, so a
    reader looks at the clock every few milliseconds and all stop close to the deadline."""
    return max(1, BATCH_BYTES // block)


def measure_reads(path: Path, method: str, *, block: int, span: int, pattern: str = "rand", readers: int = 1,
                  duration_s: float = 0.5, cpus_per_reader: Sequence[Sequence[int] | None] | None = None,
                  seed: int = 0) -> ReadResult:
    """``readers`` threads read ``block``-byte requests from the first ``span`` bytes of ``path``
    for ``duration_s`` seconds (``pattern`` "rand" or "seq"), each pinned to
    ``cpus_per_reader[i]`` if given. Offsets are multiples of ``block``.

    Each thread issues its requests through :func:`sim.profiling.preads.read_batch`, one
    blocking ``pread`` after the other in compiled code without the GIL: fio's ``psync``
    engine with ``--numjobs`` threads, request for request (see that module for why).
    """
    if pattern not in ("rand", "seq"):
        raise ValueError(f"pattern must be rand or seq, got {pattern!r}")
    slots = max(1, min(span, path.stat().st_size) // block)
    if method == FADVISE:
        drop_cached(path)
    batch = batch_size(block)
    barrier = threading.Barrier(readers + 1)
    halt = threading.Event()
    spans: list[tuple[float, float, int, int] | None] = [None] * readers
    errors: list[BaseException] = []

    def work(i: int) -> None:
        cpus = cpus_per_reader[i] if cpus_per_reader else None
        try:
            with pinned(tuple(cpus) if cpus else None):
                fd = _open(path, method)
                try:
                    buf = ReadBuffer(block)
                    batches = _offset_batches(pattern, i, readers, slots, block, np.random.default_rng([seed, i]),
                                              batch)
                    read_batch(fd, buf, next(batches)[:1])  # compiled (once per process) before the clock starts
                    clock = time.perf_counter
                    barrier.wait()
                    start = clock()
                    deadline = start + duration_s
                    done = moved = since_drop = 0
                    for offsets in batches:
                        got = read_batch(fd, buf, offsets)
                        moved += got
                        done += offsets.size
                        if method == FADVISE:
                            since_drop += got
                            if since_drop >= DROP_EVERY_BYTES:
                                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                                since_drop = 0
                        if halt.is_set() or clock() >= deadline:
                            break
                    spans[i] = (start, clock(), done, moved)
                finally:
                    os.close(fd)
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(readers)]
    for w in workers:
        w.start()
    try:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
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
