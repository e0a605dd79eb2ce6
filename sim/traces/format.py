"""The activation trace every other part of the simulator reads: :class:`Trace`.

A trace records, for each token and layer, which experts the router chose and which FFN
neurons fired in each chosen expert (dense models have one expert, ``top_k = 1``), and
optionally which neurons the predictor expected. It is the contract between the numpy
inference core / synthetic generator (writers) and the cache and engine (readers). A
:class:`Trace` holds its chunks in memory or reads them lazily from a file; the records are
:mod:`sim.traces.records`, the file :mod:`sim.traces.container` (``traces/FORMAT.md``
describes both versions for other tools). The names of both are re-exported here, where
readers have always imported them from.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sim.errors import SimError
from sim.traces.container import TraceWriter, read_chunks, read_meta, save_trace
from sim.traces.records import (
    FORMAT_VERSION,
    READ_VERSIONS,
    SOURCES,
    TraceChunk,
    TraceMeta,
    check_chunk,
    check_dims,
)

__all__ = ["FORMAT_VERSION", "READ_VERSIONS", "SOURCES", "Trace", "TraceChunk", "TraceMeta", "TraceWriter",
           "check_chunk", "check_dims", "require_tokens", "save_trace"]


def require_tokens(trace: Trace, what: str) -> None:
    """Refuse a trace of no tokens where ``what`` (statistics, a cache comparison) would be all
    zeros rather than an answer, as ``sim run`` does."""
    if trace.meta.n_tokens < 1:
        raise SimError(f"trace has 0 tokens; at least 1 is needed for {what}", source=str(trace.path or "<trace>"),
                       field="meta.n_tokens")


class Trace:
    """A trace: metadata plus chunks, held in memory or read lazily from a file.

    Readers iterate :meth:`chunks`; :meth:`load` validates the metadata eagerly and each
    chunk as it is read, so a corrupt file fails with a one-line :class:`SimError`.
    """

    def __init__(self, meta: TraceMeta, chunks: list[TraceChunk] | None = None, *, path: Path | None = None):
        self.meta = meta
        self._chunks = chunks
        self.path = path

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_rows(cls, meta: TraceMeta, active: list[np.ndarray], experts: np.ndarray | None = None,
                  predicted: list[np.ndarray] | None = None) -> Trace:
        """Build an in-memory trace from one id array per row (row order as in the format)."""
        if not isinstance(meta, TraceMeta):
            raise SimError(f"expected a TraceMeta, got {type(meta).__name__}", field="meta")
        meta.check()  # before rows_per_token divides by its fields
        if isinstance(active, str | bytes) or not isinstance(active, list | tuple):
            raise SimError(f"expected a list of id arrays (one per row), got {type(active).__name__}",
                           field="active")
        if len(active) % meta.rows_per_token:
            raise SimError(f"has {len(active)} rows, not a whole number of tokens of {meta.rows_per_token} rows "
                           "(layers x top_k)", field="active")
        for name, rows in (("active", active), ("predicted", predicted or [])):
            for row in rows:
                arr = np.asarray(row)
                if arr.size and arr.dtype.kind not in "iu":  # 1.5 would be truncated to neuron 1
                    raise SimError(f"neuron ids must be integers, got an array of dtype {arr.dtype}", field=name)
        n_tokens = len(active) // meta.rows_per_token
        if experts is None:
            experts = np.zeros((n_tokens, meta.n_layers, meta.top_k), dtype=np.int16)
            experts[:] = np.arange(meta.top_k, dtype=np.int16)
        chunks = []
        step = meta.chunk_tokens * meta.rows_per_token
        for c, row0 in enumerate(range(0, len(active), step)):
            rows = active[row0:row0 + step]
            t0 = c * meta.chunk_tokens
            offsets, ids = _csr(rows)
            pred_offsets = pred_ids = None
            if predicted is not None:
                pred_offsets, pred_ids = _csr(predicted[row0:row0 + step])
            chunks.append(TraceChunk(t0, offsets, ids, np.asarray(experts[t0:t0 + len(rows) // meta.rows_per_token],
                                                                    dtype=np.int16), pred_offsets, pred_ids))
        from dataclasses import replace
        meta = replace(meta, n_tokens=n_tokens, has_predictions=predicted is not None)
        trace = cls(meta, chunks)
        for chunk in chunks:
            check_chunk(chunk, meta)
        return trace

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Open a trace file lazily; metadata is validated now, chunks as they are read."""
        meta, path = read_meta(path)
        return cls(meta, None, path=path)

    # -- reading ------------------------------------------------------------------------
    @property
    def n_chunks(self) -> int:
        return -(-self.meta.n_tokens // self.meta.chunk_tokens)

    def chunks(self) -> Iterator[TraceChunk]:
        """Yield chunks in token order, reading each from disk only when asked for."""
        if self._chunks is not None:
            yield from self._chunks
            return
        assert self.path is not None
        yield from read_chunks(self.path, self.meta)

    def materialise(self) -> Trace:
        """Return an in-memory copy (all chunks loaded)."""
        return Trace(self.meta, list(self.chunks()))

    def chunk_for(self, t: int) -> TraceChunk:
        """The chunk holding absolute token t (loads all chunks if the trace is lazy)."""
        if self._chunks is None:
            self._chunks = list(self.chunks())
        return self._chunks[t // self.meta.chunk_tokens]

    def active(self, t: int, layer: int, slot: int = 0) -> np.ndarray:
        return self.chunk_for(t).active(t, layer, slot)

    def experts(self, t: int, layer: int) -> np.ndarray:
        chunk = self.chunk_for(t)
        return chunk.experts[t - chunk.start, layer]

    def save(self, path: str | Path, *, version: int = FORMAT_VERSION) -> Path:
        return save_trace(path, self.meta, self.chunks(), version=version)

def _csr(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate([np.asarray(r, dtype=np.int32) for r in rows]) if rows else np.zeros(0, np.int32)
    return offsets, ids.astype(np.int32, copy=False)
