"""The chunk codec of trace format version 2: a chunk as one zstd frame of small integers.

Version 1 stored every id as an int32 in a deflated ``.npy`` (a 1,000-token
TurboSparse-Mixtral-47B trace: ~500 MB, most of a minute to write). Activations are
sparse, skewed and persistent, so a row is cheap to describe against what came before:

- an active set is stored as its symmetric difference from the previous row of the same
  pool (layer, expert) in the chunk (the first row of a pool against the empty set);
- a predicted set as the difference from its own active set, in the same way against the
  previous row's (predictors err on the same neurons from token to token);
- each difference as gaps between consecutive ids, one byte each below 255
  (:mod:`sim.traces._codec_kernels`), and the chunk's arrays compressed as one zstd frame
  with a content checksum.

Rows refer only to rows of their own chunk, so a reader still decodes one chunk at a time.

Payload of a chunk (before compression), little-endian::

    magic b"PST2", version u32 = 2, n_tokens u32, n_layers u32, top_k u32, flags u32
    (bit 0: predicted sets present), then u64 byte lengths of the sections that follow:
    experts (int16, tokens x layers x top_k), active counts (u32 per row), active gaps,
    and when predicted: predicted counts (u32 per row), predicted gaps.

A corrupt frame fails zstd's checksum; a payload that decodes but disagrees with the
metadata (shapes, expert or neuron ids out of range, a stream that ends early or has
bytes left over) is a one-line :class:`~sim.errors.SimError` naming the chunk.
"""

from __future__ import annotations

import struct

import numpy as np
import zstandard

from sim.errors import SimError
from sim.traces import _codec_kernels as K

MAGIC = b"PST2"
VERSION = 2
_HEAD = struct.Struct("<4sIIIII")
_LEN = struct.Struct("<Q")
ZSTD_LEVEL = 1  # the streams are entropy-bound: higher levels are slower and barely smaller


def pools_of(experts: np.ndarray, n_experts: int) -> np.ndarray:
    """The pool (layer * n_experts + expert) of every row, in row order."""
    n_layers = experts.shape[1]
    pools = np.arange(n_layers, dtype=np.int64)[None, :, None] * n_experts + experts.astype(np.int64)
    return pools.reshape(-1)


def encode_chunk(chunk, meta) -> bytes:
    """A chunk (:class:`~sim.traces.format.TraceChunk`) as one compressed frame."""
    experts = np.ascontiguousarray(chunk.experts, dtype=np.int16)
    pools = pools_of(experts, meta.n_experts)
    n_pools = meta.n_layers * meta.n_experts
    a_off, a_ids = np.asarray(chunk.offsets, np.int64), np.asarray(chunk.ids, np.int32)
    counts, gaps, n = K.encode_rows(a_off, a_ids, pools, n_pools)
    sections = [experts.tobytes(), counts.tobytes(), gaps[:n].tobytes()]
    has_pred = chunk.pred_offsets is not None
    if has_pred:
        d_off, d_ids = K.xor_rows(np.asarray(chunk.pred_offsets, np.int64), np.asarray(chunk.pred_ids, np.int32),
                                  a_off, a_ids)
        p_counts, p_gaps, m = K.encode_rows(d_off, d_ids, pools, n_pools)
        sections += [p_counts.tobytes(), p_gaps[:m].tobytes()]
    head = _HEAD.pack(MAGIC, VERSION, chunk.n_tokens, meta.n_layers, meta.top_k, int(has_pred))
    payload = b"".join([head, *(_LEN.pack(len(s)) for s in sections), *sections])
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(payload)


def max_payload_bytes(meta, n_tokens: int) -> int:
    """The largest payload a chunk of ``n_tokens`` can have: what a frame may declare."""
    rows = n_tokens * meta.n_layers * meta.top_k
    sets = 2 if meta.has_predictions else 1
    return _HEAD.size + 5 * _LEN.size + 2 * rows + sets * rows * (4 + 5 * meta.n_neurons)


def decode_chunk(frame: bytes, meta, index: int, n_tokens: int,
                 source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Chunk ``index`` (``n_tokens`` tokens) from its frame: offsets, ids, experts, predicted
    offsets and ids (None without predictions), the fields of a
    :class:`~sim.traces.format.TraceChunk`."""
    start = index * meta.chunk_tokens
    where = f"chunk at token {start}"

    def bad(what: str, field: str = f"c{index:05d}") -> SimError:
        return SimError(f"{where}: {what}", source=source, field=field)

    limit = max_payload_bytes(meta, n_tokens)
    try:
        declared = zstandard.frame_content_size(frame)
        if declared < 0 or declared > limit:
            raise bad(f"declares {declared} bytes where at most {limit} fit the metadata (corrupt trace)")
        payload = zstandard.ZstdDecompressor().decompress(frame, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise bad(f"cannot decompress ({exc}; truncated or corrupt trace)") from None
    if len(payload) < _HEAD.size + 3 * _LEN.size:
        raise bad("payload too short (corrupt trace)")
    magic, version, tokens, n_layers, top_k, flags = _HEAD.unpack_from(payload)
    if magic != MAGIC or version != VERSION:
        raise bad(f"not a version-{VERSION} chunk (magic {magic!r}, version {version})")
    if (tokens, n_layers, top_k) != (n_tokens, meta.n_layers, meta.top_k):
        raise bad(f"holds {tokens} tokens x {n_layers} layers x top-{top_k}; the metadata implies {n_tokens} x "
                  f"{meta.n_layers} x top-{meta.top_k}", "experts")
    has_pred = bool(flags & 1)
    if has_pred != meta.has_predictions:
        raise bad("predicted sets present in the chunk but not in the metadata, or the other way round",
                  "pred_offsets")
    n_sections = 5 if has_pred else 3
    pos = _HEAD.size + n_sections * _LEN.size
    if len(payload) < pos:
        raise bad("payload too short (corrupt trace)")
    lengths = [_LEN.unpack_from(payload, _HEAD.size + i * _LEN.size)[0] for i in range(n_sections)]
    if pos + sum(lengths) != len(payload):
        raise bad("section lengths do not add up to the payload (corrupt trace)")
    rows = n_tokens * n_layers * top_k
    data = np.frombuffer(payload, np.uint8)
    if lengths[0] != 2 * rows or lengths[1] != 4 * rows or (has_pred and lengths[3] != 4 * rows):
        raise bad("section sizes do not match the chunk's rows (corrupt trace)")
    experts = np.frombuffer(payload, np.int16, rows, pos).reshape(n_tokens, n_layers, top_k).copy()
    if experts.size and (experts.min() < 0 or experts.max() >= meta.n_experts):
        raise bad(f"expert ids must be in [0, {meta.n_experts})", "experts")
    pools = pools_of(experts, meta.n_experts)
    pos += lengths[0]
    n_pools = n_layers * meta.n_experts

    def rows_of(i: int, at: int, field: str) -> tuple[np.ndarray, np.ndarray]:
        counts = np.frombuffer(payload, np.uint32, rows, at)
        gaps_at = at + lengths[i]
        off, ids, used, status = K.decode_rows(counts, data, gaps_at, gaps_at + lengths[i + 1], pools, n_pools,
                                               meta.n_neurons, 4 * int(counts.sum()))
        if status == K.TRUNCATED:
            raise bad("a row's differences run past the end of its section (corrupt trace)", field)
        if status == K.OUT_OF_RANGE:
            raise bad(f"ids must be in [0, n_neurons={meta.n_neurons})", field)
        if used != lengths[i + 1]:
            raise bad("bytes left over after the last row (corrupt trace)", field)
        return off, ids[:off[-1]]

    offsets, ids = rows_of(1, pos, "ids")
    pred_offsets = pred_ids = None
    if has_pred:
        pred_offsets, pred_ids = K.xor_rows(*rows_of(3, pos + lengths[1] + lengths[2], "pred_ids"), offsets, ids)
    return offsets, ids, experts, pred_offsets, pred_ids
