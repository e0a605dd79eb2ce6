"""From an activation trace to the engine's per-layer work items.

The engine never touches single neurons in Python: each (token, layer) yields arrays of
flat neuron keys (``((layer * n_experts) + expert) * n_neurons + neuron``) for the active
and predicted sets, and a profiling pass counts how often each key fires, which is what
PowerInfer's offline profiler uses to choose hot neurons.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numba import njit

from sim.errors import SimError
from sim.profiles.model import ModelProfile
from sim.traces.format import Trace, TraceChunk, TraceMeta


@dataclass(frozen=True)
class LayerWork:
    """One token's work at one layer: the chosen experts and their neuron keys."""

    layer: int
    experts: np.ndarray  # int, (top_k,)
    active: np.ndarray  # int64 flat keys, sorted
    predicted: np.ndarray  # int64 flat keys, sorted (== active under an oracle predictor)


def check_trace_matches(meta: TraceMeta, model: ModelProfile, source: str) -> None:
    """A trace drives a model only if their FFN shapes agree."""
    pairs = {"n_layers": (meta.n_layers, model.n_layers), "n_neurons": (meta.n_neurons, model.ffn_dim),
             "n_experts": (meta.n_experts, model.n_experts), "top_k": (meta.top_k, model.top_k)}
    for name, (got, want) in pairs.items():
        if got != want:
            raise SimError(f"trace has {name}={got} but model {model.name} has {want}; record or synthesise a "
                           "trace for this model", source=source, field=f"meta.{name}")


def key_base(meta: TraceMeta, layer: int, expert: np.ndarray | int) -> np.ndarray | int:
    return (layer * meta.n_experts + expert) * meta.n_neurons


def iter_token_layers(trace: Trace, start: int, stop: int) -> Iterator[tuple[int, list[LayerWork]]]:
    """Yield (token, [LayerWork per layer]) for tokens in [start, stop)."""
    meta = trace.meta
    for chunk in trace.chunks():
        c_end = chunk.start + chunk.n_tokens
        if c_end <= start:
            continue
        if chunk.start >= stop:
            break
        for t in range(max(start, chunk.start), min(stop, c_end)):
            yield t, _token_work(chunk, meta, t)


def _token_work(chunk: TraceChunk, meta: TraceMeta, t: int) -> list[LayerWork]:
    """All layers of one token at once: a few numpy calls per token, not per layer.

    Each row's ids are sorted and unique and the experts of one layer are distinct, so a
    layer's keys come out sorted by laying its rows out in expert order (no sort needed).
    """
    experts = chunk.experts[t - chunk.start].astype(np.int64)  # (n_layers, top_k)
    order = np.argsort(experts, axis=1, kind="stable")
    rows = chunk.row(t, 0, 0) + (np.arange(meta.n_layers)[:, None] * meta.top_k + order).reshape(-1)
    base = ((np.arange(meta.n_layers)[:, None] * meta.n_experts
             + np.take_along_axis(experts, order, axis=1)) * meta.n_neurons).reshape(-1)
    active, a_bounds = _gather_rows(chunk.offsets, chunk.ids, rows, base, meta.top_k)
    if chunk.pred_offsets is not None and chunk.pred_ids is not None:
        predicted, p_bounds = _gather_rows(chunk.pred_offsets, chunk.pred_ids, rows, base, meta.top_k)
    else:
        predicted, p_bounds = active, a_bounds
    duplicate = np.zeros(meta.n_layers, dtype=bool)
    if meta.top_k > 1:  # a malformed trace may repeat an expert: fall back to sorting that layer
        srt = np.take_along_axis(experts, order, axis=1)
        duplicate = np.any(srt[:, 1:] == srt[:, :-1], axis=1)
    out = []
    for layer in range(meta.n_layers):
        act = active[a_bounds[layer]:a_bounds[layer + 1]]
        pred = act if predicted is active else predicted[p_bounds[layer]:p_bounds[layer + 1]]
        if duplicate[layer]:
            act = np.sort(act)
            pred = act if predicted is active else np.sort(pred)
        out.append(LayerWork(layer, experts[layer], act, pred))
    return out


def _gather_rows(offsets: np.ndarray, ids: np.ndarray, rows: np.ndarray, base: np.ndarray,
                 top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat keys of ``rows`` (in that order) and each layer's bounds in the result."""
    starts, lengths = offsets[rows], offsets[rows + 1] - offsets[rows]
    ends = np.cumsum(lengths)
    index = np.arange(int(ends[-1]) if ends.size else 0, dtype=np.int64) + np.repeat(starts - (ends - lengths),
                                                                                     lengths)
    keys = ids[index].astype(np.int64) + np.repeat(base, lengths)
    bounds = np.zeros(rows.size // top_k + 1, dtype=np.int64)
    bounds[1:] = ends[top_k - 1::top_k]
    return keys, bounds


REPLAY_CACHE_BYTES = 512 * 1024 * 1024


class ReplayTrace(Trace):
    """A lazy trace (file or synthetic) whose chunks are kept in memory once read.

    A run reads its trace twice (the offline popularity profile, then the tokens), and a
    lazy trace would regenerate or re-read every chunk. This keeps the chunks read so far
    while they total at most ``limit_bytes`` (beyond that it reads the source again).
    """

    def __init__(self, source: Trace, limit_bytes: int = REPLAY_CACHE_BYTES):
        super().__init__(source.meta, None, path=source.path)
        self._source = source
        self._limit = limit_bytes
        self._kept: list[TraceChunk] = []
        self._kept_bytes = 0
        self._caching = True
        self._complete = False  # the source has been read to its end
        self.profiles: dict[tuple[int, int], np.ndarray] = {}  # see popularity()

    def chunks(self) -> Iterator[TraceChunk]:
        n_kept = len(self._kept)
        yield from self._kept[:n_kept]
        if self._caching and self._complete:
            return
        for i, chunk in enumerate(self._source.chunks()):
            if i < n_kept:
                continue
            if self._caching and i == len(self._kept):
                self._kept_bytes += sum(a.nbytes for a in (chunk.offsets, chunk.ids, chunk.experts,
                                                           chunk.pred_offsets, chunk.pred_ids) if a is not None)
                if self._kept_bytes <= self._limit:
                    self._kept.append(chunk)
                else:
                    self._caching, self._kept = False, []
            yield chunk
        self._complete = True


def replayable(trace: Trace) -> Trace:
    """``trace`` itself when its chunks are in memory (or already kept), else a :class:`ReplayTrace`."""
    if isinstance(trace, ReplayTrace) or getattr(trace, "_chunks", None) is not None:
        return trace
    return ReplayTrace(trace)


def popularity(trace: Trace, start: int, stop: int) -> np.ndarray:
    """Activation count per flat key over tokens [start, stop) (the offline profile).

    A kept trace (:class:`ReplayTrace`) remembers its profiles, read-only: the runs of a
    sweep share one trace and so one profile.
    """
    if isinstance(trace, ReplayTrace):
        key = (start, stop)
        if key not in trace.profiles:
            counts = _count_activations(trace, start, stop)
            counts.flags.writeable = False
            trace.profiles[key] = counts
        return trace.profiles[key]
    return _count_activations(trace, start, stop)


def _count_activations(trace: Trace, start: int, stop: int) -> np.ndarray:
    meta = trace.meta
    n_keys = meta.n_layers * meta.n_experts * meta.n_neurons
    counts = np.zeros(n_keys, dtype=np.int64)
    for chunk in trace.chunks():
        if chunk.start >= stop:
            break
        lo_t, hi_t = max(start, chunk.start), min(stop, chunk.start + chunk.n_tokens)
        if lo_t >= hi_t:
            continue
        r0, r1 = chunk.row(lo_t, 0, 0), chunk.row(hi_t - 1, meta.n_layers - 1, meta.top_k - 1) + 1
        _add_counts(counts, chunk.offsets, chunk.ids, chunk.experts.reshape(-1), r0, r1, meta.top_k, meta.n_layers,
                    meta.n_experts, meta.n_neurons)
    return counts


@njit(cache=True)
def _add_counts(counts, offsets, ids, experts, r0, r1, top_k, n_layers, n_experts, n_neurons):
    """counts[key] += 1 for every id of rows [r0, r1) (one pass, no key array built)."""
    for r in range(r0, r1):
        base = ((r // top_k) % n_layers * n_experts + np.int64(experts[r])) * n_neurons
        for i in range(offsets[r], offsets[r + 1]):
            counts[base + np.int64(ids[i])] += 1
