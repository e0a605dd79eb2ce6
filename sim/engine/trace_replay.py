"""Replaying a lazy trace: its chunks kept in memory once read, and read ahead on a thread.

A run reads its trace twice (the offline popularity profile, then the tokens), and a
sweep or a planner simulates many points on one trace. A lazy trace (a file read chunk
by chunk, or a synthetic one generated on the fly) would re-read or regenerate every
chunk each time; :class:`ReplayTrace` keeps them, and can read the source ahead of the
engine on a background thread.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator

import numpy as np

from sim.traces.format import Trace, TraceChunk

REPLAY_CACHE_BYTES = 512 * 1024 * 1024


class ReplayTrace(Trace):
    """A lazy trace (file or synthetic) whose chunks are kept in memory once read.

    A run reads its trace twice (the offline popularity profile, then the tokens), and a
    lazy trace would regenerate or re-read every chunk. This keeps the chunks read so far
    while they total at most ``limit_bytes`` (beyond that it reads the source again). A
    pass that stops early (the profile reads only the first tokens) leaves the source's
    iterator where it stopped, so the next pass resumes it instead of generating the
    first chunks a second time.

    ``read_ahead > 0`` reads the source on a background thread, up to that many chunks
    past the furthest one a pass has asked for. The trace generator's kernels release the
    GIL, so on a machine with a spare core the next chunks are generated while the engine
    simulates the current ones, and a run costs max(generation, simulation) rather than
    their sum. The chunks and their order are the same either way.
    """

    def __init__(self, source: Trace, limit_bytes: int = REPLAY_CACHE_BYTES, read_ahead: int = 0):
        super().__init__(source.meta, None, path=source.path)
        self._source = source
        self._limit = limit_bytes
        self._kept: list[TraceChunk] = []
        self._kept_bytes = 0
        self._caching = True
        self._reader: Iterator[TraceChunk] | None = None  # the source, positioned after the kept chunks
        self._complete = False  # the source has been read to its end
        self.profiles: dict[tuple[int, int], np.ndarray] = {}  # see sim.engine.workload.popularity
        self._read_ahead = read_ahead
        self._cond = threading.Condition()
        self._wanted = 0  # the furthest chunk index a pass has asked for
        self._error: BaseException | None = None
        if read_ahead > 0:
            threading.Thread(target=_read_ahead_worker, args=(weakref.ref(self), self._cond), daemon=True,
                             name="trace-read-ahead").start()

    def chunks(self) -> Iterator[TraceChunk]:
        i = 0  # chunks this pass has yielded
        while self._caching:
            if self._read_ahead:
                chunk = self._wait_for(i)
                if chunk is None:
                    if self._complete:
                        return
                    break  # the reader stopped keeping chunks: read the source below
                yield chunk
                i += 1
                continue
            if i < len(self._kept):
                yield self._kept[i]
                i += 1
                continue
            if self._complete:
                return
            if self._reader is None:
                self._reader = iter(self._source.chunks())
            chunk = next(self._reader, None)
            if chunk is None:
                self._complete, self._reader = True, None
                return
            if self._keep(chunk):
                continue  # the loop yields it from the list
            reader, self._reader = self._reader, None  # over the limit: this pass finishes on the reader
            yield chunk
            yield from reader
            return
        for j, chunk in enumerate(self._source.chunks()):  # not kept: read the source again
            if j >= i:
                yield chunk

    def _wait_for(self, i: int) -> TraceChunk | None:
        """Kept chunk ``i`` once the background reader has it; None at the end or past the limit."""
        with self._cond:
            if i > self._wanted:
                self._wanted = i
                self._cond.notify_all()
            while i >= len(self._kept) and self._caching and not self._complete and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            return self._kept[i] if i < len(self._kept) else None

    def _keep(self, chunk: TraceChunk) -> bool:
        """Keep ``chunk`` if the byte limit allows; past it, drop everything kept and stop keeping."""
        self._kept_bytes += sum(a.nbytes for a in (chunk.offsets, chunk.ids, chunk.experts, chunk.pred_offsets,
                                                   chunk.pred_ids) if a is not None)
        if self._kept_bytes <= self._limit:
            self._kept.append(chunk)
            return True
        self._caching, self._kept = False, []
        return False


def _read_ahead_worker(ref: weakref.ref[ReplayTrace], cond: threading.Condition) -> None:
    """Fill a ReplayTrace's kept chunks ahead of its passes; holds the trace only weakly, so a
    trace nobody uses any more is freed and the thread ends (it re-checks every second)."""
    trace = ref()
    if trace is None:
        return
    reader = iter(trace._source.chunks())
    try:
        while True:
            with cond:
                while trace._caching and len(trace._kept) > trace._wanted + trace._read_ahead:
                    del trace
                    cond.wait(timeout=1.0)
                    trace = ref()
                    if trace is None:
                        return
                if not trace._caching:
                    return
            chunk = next(reader, None)  # outside the lock: generating or reading happens here
            with cond:
                if chunk is None:
                    trace._complete = True
                else:
                    trace._keep(chunk)
                cond.notify_all()
                if chunk is None or not trace._caching:
                    return
    except BaseException as exc:  # handed to the passes waiting for chunks
        owner = ref()
        with cond:
            if owner is not None:
                owner._error = exc
            cond.notify_all()


def replayable(trace: Trace, read_ahead: int = 0) -> Trace:
    """``trace`` itself when its chunks are in memory (or already kept), else a :class:`ReplayTrace`."""
    if isinstance(trace, ReplayTrace) or getattr(trace, "_chunks", None) is not None:
        return trace
    return ReplayTrace(trace, read_ahead=read_ahead)
