"""A trace's records in memory: its metadata (:class:`TraceMeta`) and chunks (:class:`TraceChunk`).

What every reader and writer of traces agrees on, whatever holds them: the fields and the
rules they obey (checked here, so a trace built in memory fails as a file would). The file
that stores them is :mod:`sim.traces.container`; :class:`sim.traces.format.Trace` is what
the rest of the simulator reads.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sim.errors import SimError

FORMAT_VERSION = 2  # what the writers produce
READ_VERSIONS = (1, 2)
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
