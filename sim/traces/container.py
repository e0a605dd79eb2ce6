"""The trace file: how a trace's records are stored on disk, read back and written.

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

import os
import secrets
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SimError
from sim.traces.records import FORMAT_VERSION, READ_VERSIONS, TraceChunk, TraceMeta, check_chunk

V2_META = "meta.json"


def read_meta(path: str | Path) -> tuple[TraceMeta, Path]:
    """A trace file's metadata, validated, with the file's path: every member its chunks need is
    there (so a truncated file fails now, in one line); the chunks are read later, one at a time."""
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
    return meta, path


def read_chunks(path: Path, meta: TraceMeta) -> Iterator[TraceChunk]:
    """The chunks of the trace file ``path`` (whose metadata is ``meta``) in token order, each
    read, decoded and checked only when asked for."""
    src = str(path)
    try:
        with zipfile.ZipFile(path) as zf:
            for c in range(-(-meta.n_tokens // meta.chunk_tokens)):
                expected = min(meta.chunk_tokens, meta.n_tokens - c * meta.chunk_tokens)
                if meta.version == 2:
                    from sim.traces.codec import decode_chunk

                    yield TraceChunk(c * meta.chunk_tokens,
                                     *decode_chunk(zf.read(f"c{c:05d}.zst"), meta, c, expected, src))
                    continue
                chunk = _read_chunk(zf, c, meta, src)
                if chunk.experts.ndim != 3:
                    raise SimError(f"chunk {c}: experts has shape {chunk.experts.shape}; expected (tokens, "
                                   f"n_layers={meta.n_layers}, top_k={meta.top_k})", source=src,
                                   field="experts")
                if chunk.experts.shape[0] != expected:
                    raise SimError(f"chunk {c} holds {chunk.experts.shape[0] if chunk.experts.ndim else 0} "
                                   f"tokens; the metadata (n_tokens={meta.n_tokens}, chunk_tokens="
                                   f"{meta.chunk_tokens}) implies {expected}", source=src, field="experts")
                check_chunk(chunk, meta, src)
                yield chunk
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, zlib.error) as exc:
        raise SimError(f"cannot read trace chunk (truncated or corrupt: {exc})", source=src) from None


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
