"""The activation-trace format every other part of the simulator reads.

A trace records, for each token and layer, which experts the router chose and which FFN
neurons fired in each chosen expert (dense models have one expert, ``top_k = 1``), and
optionally which neurons the predictor expected. It is the contract between the numpy
inference core / synthetic generator (writers) and the cache and engine (readers).
``traces/FORMAT.md`` describes both versions for other tools.

Both versions are a zip file (``.npz``) of a metadata member and one or more members per
chunk of ``meta.chunk_tokens`` consecutive tokens, so a reader touches one chunk at a
time. Writers produce version 2 (:mod:`sim.traces.codec`: each chunk one zstd frame of
row-to-row differences, ~10x smaller and faster to write than version 1); readers take
both, and ``save_trace(..., version=1)`` still writes version 1.

Version 1 (one compressed ``.npz``):

- ``meta``: UTF-8 JSON of :class:`TraceMeta`.
- Rows are ``(token, layer, slot)`` with ``slot < top_k``; row index
  ``r = (t * n_layers + l) * top_k + slot`` *within a chunk* (t relative to the chunk).
- Tokens are stored in chunks of ``meta.chunk_tokens`` consecutive tokens. Chunk ``c``
  has members ``c{c:05d}_offsets`` (int64, n_rows + 1, starts at 0, non-decreasing),
  ``c{c:05d}_ids`` (int32 neuron ids, each row's ids sorted ascending and unique),
  ``c{c:05d}_experts`` (int16, shape (tokens, n_layers, top_k)), and when the trace has
  predictions ``c{c:05d}_pred_offsets`` / ``c{c:05d}_pred_ids`` of the same form.

Version 2: ``meta.json`` (the same metadata as UTF-8 JSON) and one stored (uncompressed)
member ``c{c:05d}.zst`` per chunk, decoded to the same arrays (see :mod:`sim.traces.codec`).

Chunks are separate zip members, so a 10k-token Mixtral-47B trace (~10^9 ids) never has
to be in memory at once. The writers stream chunks into the zip, so producing one does
not need it in memory either.
"""

from __future__ import annotations

import json
import os
import secrets
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SimError

FORMAT_VERSION = 2  # what the writers produce
READ_VERSIONS = (1, 2)
V2_META = "meta.json"
SOURCES = ("recorded", "synthetic")


@dataclass(frozen=True)
class TraceMeta:
    """What a trace is of: model dimensions, provenance and predictor quality."""

    model: str
    n_layers: int
    n_neurons: int  # FFN neurons per expert (the FFN width for dense models)
    hidden: int
    n_experts: int = 1
    top_k: int = 1
    n_tokens: int = 0
    prompt_tokens: int = 0  # the first prompt_tokens tokens are prefill, the rest decode
    source: str = "synthetic"
    seed: int | None = None
    chunk_tokens: int = 64
    has_predictions: bool = False
    activation_threshold: float | None = None  # for GELU/SiLU models: |act| > threshold
    predictor: dict[str, Any] = field(default_factory=dict)  # recall, precision, ...
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    @property
    def rows_per_token(self) -> int:
        return self.n_layers * self.top_k

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str) -> TraceMeta:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SimError(f"metadata is not valid JSON ({exc.msg})", source=source, field="meta") from None
        if not isinstance(raw, dict):
            raise SimError("metadata must be a JSON object", source=source, field="meta")
        version = raw.get("version")
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise SimError(
                f"unsupported trace format version {version!r}; this simulator reads versions "
                f"{', '.join(map(str, READ_VERSIONS))}", source=source, field="meta.version",
            )
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise SimError(f"unknown metadata keys {unknown}", source=source, field="meta")
        try:
            meta = cls(**raw)
        except TypeError as exc:
            raise SimError(f"incomplete metadata ({exc})", source=source, field="meta") from None
        meta.check(source)
        return meta

    def check(self, source: str = "<trace>") -> None:
        """Raise a one-line SimError if the metadata is inconsistent."""
        positive = {"n_layers": self.n_layers, "n_neurons": self.n_neurons, "hidden": self.hidden,
                    "n_experts": self.n_experts, "top_k": self.top_k, "chunk_tokens": self.chunk_tokens}
        for name, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SimError(f"must be a positive integer, got {value!r}", source=source, field=f"meta.{name}")
        if self.top_k > self.n_experts:
            raise SimError(f"top_k {self.top_k} exceeds n_experts {self.n_experts}", source=source, field="meta.top_k")
        if not isinstance(self.n_tokens, int) or self.n_tokens < 0:
            raise SimError(f"must be an integer >= 0, got {self.n_tokens!r}", source=source, field="meta.n_tokens")
        if not isinstance(self.prompt_tokens, int) or not 0 <= self.prompt_tokens <= self.n_tokens:
            raise SimError(f"must be in [0, n_tokens={self.n_tokens}], got {self.prompt_tokens!r}",
                           source=source, field="meta.prompt_tokens")
        if isinstance(self.n_tokens, bool) or isinstance(self.prompt_tokens, bool):
            raise SimError("must be an integer, got a boolean", source=source,
                           field="meta.n_tokens" if isinstance(self.n_tokens, bool) else "meta.prompt_tokens")
        _check_meta_types(self, source)
        if self.source not in SOURCES:
            raise SimError(f"must be one of {list(SOURCES)}, got {self.source!r}", source=source, field="meta.source")
        if self.n_neurons > np.iinfo(np.int32).max:
            raise SimError("n_neurons does not fit int32 ids", source=source, field="meta.n_neurons")


# The JSON type each metadata key must have (a hand edit can write "no" for false or a list
# for a mapping, which Python would read as true or fail on later with an AttributeError).
_META_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,), "source": (str,), "seed": (int, type(None)), "has_predictions": (bool,),
    "activation_threshold": (int, float, type(None)), "predictor": (dict,), "extra": (dict,),
}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a JSON object",
               type(None): "null"}


def _check_meta_types(meta: TraceMeta, source: str) -> None:
    for name, types in _META_TYPES.items():
        value = getattr(meta, name)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            allowed = " or ".join(_TYPE_NAMES[t] for t in types if not (t is int and float in types))
            raise SimError(f"must be {allowed}, got {json.dumps(value) if _jsonable(value) else repr(value)}",
                           source=source, field=f"meta.{name}")
    if meta.activation_threshold is not None and not np.isfinite(meta.activation_threshold):
        raise SimError(f"must be a finite number or null, got {meta.activation_threshold!r}", source=source,
                       field="meta.activation_threshold")


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def require_tokens(trace: Trace, what: str) -> None:
    """Refuse a trace of no tokens where ``what`` (statistics, a cache comparison) would be all
    zeros rather than an answer, as ``sim run`` does."""
    if trace.meta.n_tokens < 1:
        raise SimError(f"trace has 0 tokens; at least 1 is needed for {what}", source=str(trace.path or "<trace>"),
                       field="meta.n_tokens")


@dataclass
class TraceChunk:
    """Consecutive tokens ``[start, start + n_tokens)`` of a trace, as CSR arrays."""

    start: int
    offsets: np.ndarray  # int64, rows + 1
    ids: np.ndarray  # int32
    experts: np.ndarray  # int16, (tokens, n_layers, top_k)
    pred_offsets: np.ndarray | None = None
    pred_ids: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.experts.shape[0])

    def row(self, t: int, layer: int, slot: int = 0) -> int:
        """Row index of absolute token ``t`` (which must lie in this chunk)."""
        n_layers, top_k = self.experts.shape[1], self.experts.shape[2]
        return ((t - self.start) * n_layers + layer) * top_k + slot

    def active(self, t: int, layer: int, slot: int = 0) -> np.ndarray:
        r = self.row(t, layer, slot)
        return self.ids[self.offsets[r]:self.offsets[r + 1]]

    def predicted(self, t: int, layer: int, slot: int = 0) -> np.ndarray:
        if self.pred_offsets is None or self.pred_ids is None:
            raise SimError("trace has no predicted sets", field="pred_ids")
        r = self.row(t, layer, slot)
        return self.pred_ids[self.pred_offsets[r]:self.pred_offsets[r + 1]]

    def counts(self) -> np.ndarray:
        """Active neurons per row, shaped (tokens, n_layers, top_k)."""
        return np.diff(self.offsets).reshape(self.experts.shape)


def check_chunk(chunk: TraceChunk, meta: TraceMeta, source: str = "<trace>") -> None:
    """Validate one chunk against the metadata; raise a one-line SimError on any defect."""
    prefix = f"chunk at token {chunk.start}"
    for name in ("offsets", "ids", "experts", "pred_offsets", "pred_ids"):
        arr = getattr(chunk, name)
        if arr is not None and (not isinstance(arr, np.ndarray) or not np.issubdtype(arr.dtype, np.integer)):
            kind = arr.dtype if isinstance(arr, np.ndarray) else type(arr).__name__
            raise SimError(f"{prefix}: {name} must be an integer array, got {kind}", source=source, field=name)
    exp = chunk.experts
    if exp.ndim != 3 or exp.shape[1:] != (meta.n_layers, meta.top_k):
        raise SimError(f"{prefix}: experts shape {exp.shape} does not match (tokens, n_layers={meta.n_layers}, "
                       f"top_k={meta.top_k})", source=source, field="experts")
    if exp.size and (exp.min() < 0 or exp.max() >= meta.n_experts):
        raise SimError(f"{prefix}: expert ids must be in [0, {meta.n_experts})", source=source, field="experts")
    if meta.top_k > 1 and exp.size:
        srt = np.sort(exp, axis=2)
        if np.any(srt[:, :, 1:] == srt[:, :, :-1]):
            raise SimError(f"{prefix}: a token chose the same expert twice in one layer", source=source,
                           field="experts")
    n_rows = exp.shape[0] * meta.rows_per_token
    pairs = [("offsets", "ids", chunk.offsets, chunk.ids)]
    if meta.has_predictions:
        if chunk.pred_offsets is None or chunk.pred_ids is None:
            raise SimError(f"{prefix}: metadata says predictions are present but arrays are missing",
                           source=source, field="pred_offsets")
        pairs.append(("pred_offsets", "pred_ids", chunk.pred_offsets, chunk.pred_ids))
    for off_name, id_name, off, ids in pairs:
        if ids.ndim != 1:
            raise SimError(f"{prefix}: {id_name} must be one-dimensional, got shape {ids.shape}", source=source,
                           field=id_name)
        if off.ndim != 1 or off.shape[0] != n_rows + 1:
            raise SimError(f"{prefix}: {off_name} has {off.shape[0] if off.ndim == 1 else off.shape} entries, "
                           f"expected rows + 1 = {n_rows + 1}", source=source, field=off_name)
        if off[0] != 0 or np.any(np.diff(off) < 0):
            raise SimError(f"{prefix}: {off_name} must start at 0 and never decrease", source=source,
                           field=off_name)
        if off[-1] != ids.shape[0]:
            raise SimError(f"{prefix}: {off_name} ends at {int(off[-1])} but {id_name} has {ids.shape[0]} entries",
                           source=source, field=off_name)
        if ids.size and (ids.min() < 0 or ids.max() >= meta.n_neurons):
            raise SimError(f"{prefix}: {id_name} must be in [0, n_neurons={meta.n_neurons})", source=source,
                           field=id_name)
        if ids.size > 1:
            # Within a row ids are strictly increasing; a decrease is allowed only at a row start.
            bad = np.flatnonzero(np.diff(ids) <= 0) + 1
            starts = np.zeros(ids.shape[0], dtype=bool)
            starts[off[:-1][np.diff(off) > 0]] = True
            if bad.size and not np.all(starts[bad]):
                raise SimError(f"{prefix}: {id_name} within a row must be sorted and unique", source=source,
                               field=id_name)


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
        if not isinstance(path, str | os.PathLike):
            raise SimError(f"expected a trace file path, got {type(path).__name__}", field="path")
        path = Path(path)
        src = str(path)
        if path.is_dir():
            raise SimError("is a folder; expected a trace file (.npz)", source=src)
        if not path.is_file():
            raise SimError("no such trace file", source=src)
        try:
            with zipfile.ZipFile(path) as zf:
                names = set(zf.namelist())
                if V2_META in names:
                    text = zf.read(V2_META).decode("utf-8", errors="replace")
                elif "meta.npy" in names:
                    raw = read_member(zf, "meta.npy")
                    if raw.dtype.kind not in "iu" or raw.ndim != 1:
                        raise SimError(f"metadata must be a 1-D array of UTF-8 bytes, got {raw.dtype} of shape "
                                       f"{raw.shape}", field="meta")
                    text = bytes(raw.astype(np.uint8)).decode("utf-8", errors="replace")
                else:
                    raise SimError("not a trace file: no 'meta' member", field="meta")
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error) as exc:
            raise SimError(f"cannot read trace (truncated or not an .npz trace: {exc})", source=src) from None
        except SimError as err:
            raise SimError(err.detail, source=src, field=err.field) from None
        meta = TraceMeta.from_json(text, src)
        container = 2 if V2_META in names else 1
        if meta.version != container:
            raise SimError(f"says version {meta.version} but is laid out as version {container}", source=src,
                           field="meta.version")
        for c in range(-(-meta.n_tokens // meta.chunk_tokens)):
            members = [f"c{c:05d}.zst"] if container == 2 else [f"c{c:05d}_{k}.npy" for k in ("offsets", "ids",
                                                                                             "experts")]
            for member in members:
                if member not in names:
                    kind = member.removesuffix(".npy")[len("c00000_"):] or member
                    raise SimError(f"member {member.removesuffix('.npy')} is missing (truncated trace?)", source=src,
                                   field=kind if container == 1 else member)
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
        src = str(self.path)
        try:
            with zipfile.ZipFile(self.path) as zf:
                for c in range(self.n_chunks):
                    expected = min(self.meta.chunk_tokens, self.meta.n_tokens - c * self.meta.chunk_tokens)
                    if self.meta.version == 2:
                        from sim.traces.codec import decode_chunk

                        yield TraceChunk(c * self.meta.chunk_tokens,
                                         *decode_chunk(zf.read(f"c{c:05d}.zst"), self.meta, c, expected, src))
                        continue
                    chunk = _read_chunk(zf, c, self.meta, src)
                    if chunk.experts.ndim != 3:
                        raise SimError(f"chunk {c}: experts has shape {chunk.experts.shape}; expected (tokens, "
                                       f"n_layers={self.meta.n_layers}, top_k={self.meta.top_k})", source=src,
                                       field="experts")
                    if chunk.experts.shape[0] != expected:
                        raise SimError(f"chunk {c} holds {chunk.experts.shape[0] if chunk.experts.ndim else 0} "
                                       f"tokens; the metadata (n_tokens={self.meta.n_tokens}, chunk_tokens="
                                       f"{self.meta.chunk_tokens}) implies {expected}", source=src, field="experts")
                    check_chunk(chunk, self.meta, src)
                    yield chunk
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, zlib.error) as exc:
            raise SimError(f"cannot read trace chunk (truncated or corrupt: {exc})", source=src) from None

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


# Deflate expands at most ~1032:1, so a member's data cannot exceed this many times its stored size.
_MAX_DEFLATE_RATIO = 1032
# The dtype readers compute with: any integer dtype or byte order in a file is cast to these (after
# a range check), so compiled kernels see one signature and uint64 offsets or '>i4' ids just work.
CANONICAL = {"offsets": np.dtype(np.int64), "ids": np.dtype(np.int32), "experts": np.dtype(np.int16),
             "pred_offsets": np.dtype(np.int64), "pred_ids": np.dtype(np.int32)}


def read_member(zf: zipfile.ZipFile, name: str) -> np.ndarray:
    """One ``.npy`` member of the zip, its header checked against the member's size first: a
    header declaring 10^12 ids in a few bytes is a corrupt trace, not an allocation of TiB."""
    info = zf.getinfo(name)
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh) if version == (2, 0) else \
                np.lib.format._read_array_header(fh, version)  # type: ignore[attr-defined]
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    room = info.file_size
    if info.compress_type != zipfile.ZIP_STORED:
        room = min(room, info.compress_size * _MAX_DEFLATE_RATIO + 4096)
    if declared > room:
        raise SimError(f"member {name} declares shape {tuple(shape)} of {dtype} ({declared} bytes) but holds at "
                       f"most {room} bytes; the trace is corrupt", field=name.removesuffix(".npy"))
    with zf.open(info) as fh:
        return np.lib.format.read_array(fh, allow_pickle=False)


def canonical(arr: np.ndarray, kind: str, prefix: str, source: str) -> np.ndarray:
    """``arr`` in the dtype readers expect for ``kind``, native byte order; values outside that
    dtype's range are an error (a cast would wrap them into valid-looking ids)."""
    target = CANONICAL[kind]
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iu":
        return arr  # check_chunk names the wrong dtype
    if arr.dtype == target:
        return arr
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        info = np.iinfo(target)
        if lo < info.min or hi > info.max:
            raise SimError(f"{prefix}: {kind} holds {lo if lo < info.min else hi}, outside {target}'s range "
                           f"[{info.min}, {info.max}]", source=source, field=kind)
    return arr.astype(target)


def _read_chunk(zf: zipfile.ZipFile, c: int, meta: TraceMeta, source: str = "<trace>") -> TraceChunk:
    def arr(kind: str) -> np.ndarray:
        try:
            raw = read_member(zf, f"c{c:05d}_{kind}.npy")
        except SimError as err:
            raise SimError(err.detail, source=source, field=err.field) from None
        return canonical(raw, kind, f"chunk at token {c * meta.chunk_tokens}", source)

    pred_off = pred_ids = None
    if meta.has_predictions:
        names = set(zf.namelist())
        if f"c{c:05d}_pred_offsets.npy" in names and f"c{c:05d}_pred_ids.npy" in names:
            pred_off, pred_ids = arr("pred_offsets"), arr("pred_ids")
    return TraceChunk(c * meta.chunk_tokens, arr("offsets"), arr("ids"), arr("experts"), pred_off, pred_ids)


def save_trace(path: str | Path, meta: TraceMeta, chunks: Iterable[TraceChunk], *,
               version: int = FORMAT_VERSION) -> Path:
    """Stream chunks into a trace file (``version`` 2 by default, 1 on request); tokens are
    counted as they are written, and the file appears only when complete (a ``.part`` file
    beside it is renamed over it, so readers never see half a trace).

    The metadata's ``n_tokens`` is set from what was written, and each chunk must hold
    ``meta.chunk_tokens`` tokens except the last.
    """
    if isinstance(version, bool) or version not in READ_VERSIONS:
        raise SimError(f"must be one of {', '.join(map(str, READ_VERSIONS))}, got {version!r}", field="version")
    path = Path(path)
    if version == 2:
        writer = TraceWriter(path, meta)
        try:
            for chunk in chunks:
                writer.add(chunk)
        except BaseException:
            writer.abort()
            raise
        return writer.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.part")  # one per writer
    try:
        _write_zip(tmp, path, meta, chunks)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


class _ChunkCounter:
    """The rules every writer applies to the chunks it is given, and the metadata it ends with."""

    def __init__(self, meta: TraceMeta, path: Path):
        self.meta, self.path = meta, path
        self.n_tokens = 0
        self.has_pred: bool | None = None
        self._last_short = False

    def add(self, chunk: TraceChunk) -> None:
        if self._last_short:
            raise SimError("only the last chunk may hold fewer than chunk_tokens tokens", source=str(self.path))
        if chunk.n_tokens != self.meta.chunk_tokens:
            self._last_short = True
        chunk_has_pred = chunk.pred_offsets is not None
        if self.has_pred is None:
            self.has_pred = chunk_has_pred
        elif self.has_pred != chunk_has_pred:
            raise SimError("either every chunk has predicted sets or none does", source=str(self.path))
        self.n_tokens += chunk.n_tokens

    def final(self, version: int) -> TraceMeta:
        from dataclasses import replace

        has_pred = self.meta.has_predictions if self.has_pred is None else self.has_pred  # no chunk: keep the flag
        final = replace(self.meta, n_tokens=self.n_tokens, has_predictions=bool(has_pred), version=version,
                        prompt_tokens=min(self.meta.prompt_tokens, self.n_tokens))
        final.check(str(self.path))
        return final


class TraceWriter:
    """A version-2 trace file written chunk by chunk: :meth:`add` each chunk in order, then
    :meth:`close` (which renames the ``.part`` file into place) or :meth:`abort`.

    Each chunk is encoded and compressed on a second thread (both release the GIL) while
    the caller produces the next, so writing a generated trace costs about as much as
    generating it.
    """

    def __init__(self, path: str | Path, meta: TraceMeta):
        from sim.traces.codec import encode_chunk

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}-{secrets.token_hex(4)}.part")  # one per writer
        self._meta, self._encode = meta, encode_chunk
        self._counter = _ChunkCounter(meta, self.path)
        self._zip: zipfile.ZipFile | None = zipfile.ZipFile(self._tmp, "w", compression=zipfile.ZIP_STORED)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="trace-encode")
        self._pending: tuple[int, Any] | None = None
        self._n = 0

    def add(self, chunk: TraceChunk) -> None:
        assert self._zip is not None, "the writer is closed"
        self._counter.add(chunk)
        job = (self._n, self._pool.submit(self._encode, chunk, self._meta))
        self._n += 1
        self._flush()
        self._pending = job

    def _flush(self) -> None:
        if self._pending is not None and self._zip is not None:
            index, frame = self._pending
            self._zip.writestr(f"c{index:05d}.zst", frame.result())
            self._pending = None

    def close(self) -> Path:
        """Finish the file: the last chunk, the metadata, then the rename into place."""
        assert self._zip is not None, "the writer is closed"
        try:
            self._flush()
            self._zip.writestr(V2_META, self._counter.final(2).to_json())
            self._zip.close()
            self._zip = None
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        finally:
            self._pool.shutdown()
        return self.path

    def abort(self) -> None:
        """Drop the partial file (safe to call more than once)."""
        self._pool.shutdown(cancel_futures=True)
        if self._zip is not None:
            self._zip.close()
            self._zip = None
        self._tmp.unlink(missing_ok=True)


def _write_zip(tmp: Path, path: Path, meta: TraceMeta, chunks: Iterable[TraceChunk]) -> None:
    """Version 1: every array a deflated ``.npy`` member."""
    counter = _ChunkCounter(meta, path)
    # Level 1: sorted int32 ids compress about as well as at level 6, several times faster.
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for c, chunk in enumerate(chunks):
            counter.add(chunk)
            arrays = {"offsets": chunk.offsets.astype(np.int64, copy=False),
                      "ids": chunk.ids.astype(np.int32, copy=False),
                      "experts": chunk.experts.astype(np.int16, copy=False)}
            if chunk.pred_offsets is not None:
                arrays["pred_offsets"] = chunk.pred_offsets.astype(np.int64, copy=False)
                arrays["pred_ids"] = chunk.pred_ids.astype(np.int32, copy=False)
            for kind, array in arrays.items():
                with zf.open(f"c{c:05d}_{kind}.npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, np.ascontiguousarray(array), allow_pickle=False)
        meta_bytes = np.frombuffer(counter.final(1).to_json().encode("utf-8"), dtype=np.uint8)
        with zf.open("meta.npy", "w") as fh:
            np.lib.format.write_array(fh, meta_bytes, allow_pickle=False)


def check_dims(meta: TraceMeta, *, n_layers: int, n_neurons: int, n_experts: int = 1, top_k: int = 1,
               hidden: int | None = None, source: str = "<trace>") -> None:
    """Raise a one-line SimError if a trace was made for other model dimensions."""
    want = {"n_layers": n_layers, "n_neurons": n_neurons, "n_experts": n_experts, "top_k": top_k}
    if hidden is not None:
        want["hidden"] = hidden
    for name, value in want.items():
        got = getattr(meta, name)
        if got != value:
            raise SimError(f"trace has {name}={got} but the model has {value} (trace made for {meta.model!r})",
                           source=source, field=f"meta.{name}")
