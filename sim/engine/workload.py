"""From an activation trace to the engine's per-layer work items, and the offline profile.

The engine never touches single neurons in Python: each (token, layer) yields arrays of
flat neuron keys (``((layer * n_experts) + expert) * n_neurons + neuron``) for the active
and predicted sets, and a profiling pass counts how often each key fires, which is what
PowerInfer's offline profiler uses to choose hot neurons.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

from sim.engine.trace_replay import ReplayTrace
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


def iter_token_layers(trace: Trace, start: int, stop: int) -> Iterator[tuple[int, TokenWork]]:
    """Yield (token, its :class:`TokenWork`) for tokens in [start, stop)."""
    meta = trace.meta
    for chunk in trace.chunks():
        c_end = chunk.start + chunk.n_tokens
        if c_end <= start:
            continue
        if chunk.start >= stop:
            break
        for t in range(max(start, chunk.start), min(stop, c_end)):
            yield t, _token_work(chunk, meta, t)
        if c_end >= stop:  # done: do not wait for (or generate) the next chunk
            break


class TokenWork(Sequence[LayerWork]):
    """One token's work at every layer, as rows of a trace chunk's key tables.

    Row ``j`` of the token is ``ids[offsets[rows[j]]:offsets[rows[j] + 1]] + base[j]`` (the
    flat keys of one chosen expert), and layer ``l`` is rows ``[l * per_layer, (l + 1) *
    per_layer)``, laid out in expert order so each layer's keys come out sorted. Compiled
    planners read the rows straight from the chunk (:meth:`key_rows`); the flat arrays
    (``active[a_bounds[l]:a_bounds[l + 1]]`` is layer ``l``'s active set, sorted; the same
    for ``predicted``) are gathered on first use, and code that walks layers one by one
    indexes or iterates it as a sequence of :class:`LayerWork` (views into those arrays).
    """

    def __init__(self, experts: np.ndarray, rows: np.ndarray, base: np.ndarray, per_layer: int,
                 active_table: tuple[np.ndarray, np.ndarray], predicted_table: tuple[np.ndarray, np.ndarray],
                 layer_ids: np.ndarray | None = None):
        self.experts = experts  # (n_layers, top_k), in the trace's order
        self.rows, self.base, self.per_layer = rows, base, per_layer
        self.active_table = active_table  # (offsets, ids) of a CSR table
        self.predicted_table = predicted_table  # the same object under an oracle predictor
        n_layers = rows.shape[0] // per_layer
        # the model layer of each entry (all of them in order, unless made from a few layers)
        self.layer_ids = np.arange(n_layers) if layer_ids is None else layer_ids
        self._flat: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._layers: list[LayerWork] | None = None

    @classmethod
    def from_layers(cls, layers: Sequence[LayerWork]) -> TokenWork:
        """The flat form of consecutive layers' work (layer ``i`` of it is ``layers[i]``)."""
        if isinstance(layers, TokenWork):
            return layers
        oracle = all(w.predicted is w.active for w in layers)
        active, a_bounds = _concat([w.active for w in layers])
        predicted, p_bounds = (active, a_bounds) if oracle else _concat([w.predicted for w in layers])
        experts = np.array([w.experts for w in layers], dtype=np.int64).reshape(len(layers), -1)
        n = len(layers)
        a_table = (a_bounds, active)  # each layer one row of base 0
        tw = cls(experts, np.arange(n), np.zeros(n, dtype=np.int64), 1, a_table,
                 a_table if oracle else (p_bounds, predicted), np.array([w.layer for w in layers], np.int64))
        tw._flat["active"] = (active, a_bounds)
        tw._flat["predicted"] = (predicted, p_bounds)
        tw._layers = list(layers)
        return tw

    @property
    def oracle(self) -> bool:
        return self.predicted_table is self.active_table

    def key_rows(self) -> tuple[np.ndarray, ...]:
        """(active offsets, active ids, predicted offsets, predicted ids, rows, base, rows per
        layer): what compiled planners read instead of the flat arrays."""
        return (*self.active_table, *self.predicted_table, self.rows, self.base, self.per_layer)

    def _gathered(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        if which not in self._flat:
            if which == "predicted" and self.oracle:
                self._flat[which] = self._gathered("active")
            else:
                offsets, ids = self.active_table if which == "active" else self.predicted_table
                self._flat[which] = _gather_rows(offsets, ids, self.rows, self.base, self.per_layer)
        return self._flat[which]

    @property
    def active(self) -> np.ndarray:
        return self._gathered("active")[0]

    @property
    def a_bounds(self) -> np.ndarray:
        return self._gathered("active")[1]

    @property
    def predicted(self) -> np.ndarray:
        return self._gathered("predicted")[0]

    @property
    def p_bounds(self) -> np.ndarray:
        return self._gathered("predicted")[1]

    @property
    def layers(self) -> list[LayerWork]:
        if self._layers is None:
            a, p = self.a_bounds, self.p_bounds
            oracle = self.oracle
            self._layers = [LayerWork(int(self.layer_ids[i]), self.experts[i], act := self.active[a[i]:a[i + 1]],
                                      act if oracle else self.predicted[p[i]:p[i + 1]])
                            for i in range(len(a) - 1)]
        return self._layers

    def __len__(self) -> int:
        return self.rows.shape[0] // self.per_layer

    def __getitem__(self, i):  # type: ignore[override]
        return self.layers[i]

    def __iter__(self) -> Iterator[LayerWork]:
        return iter(self.layers)


def _concat(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    bounds = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([x.size for x in parts], out=bounds[1:])
    flat = np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, dtype=np.int64)
    return flat, bounds


def _token_work(chunk: TraceChunk, meta: TraceMeta, t: int) -> TokenWork:
    """All layers of one token at once, as rows of the chunk (nothing gathered yet).

    Each row's ids are sorted and unique and the experts of one layer are distinct (the
    trace format rejects a repeated one), so a layer's keys come out sorted by laying its
    rows out in expert order (no sort needed).
    """
    experts = chunk.experts[t - chunk.start].astype(np.int64)  # (n_layers, top_k)
    order = np.argsort(experts, axis=1, kind="stable")
    by_expert = np.take_along_axis(experts, order, axis=1)
    rows = chunk.row(t, 0, 0) + (np.arange(meta.n_layers)[:, None] * meta.top_k + order).reshape(-1)
    base = ((np.arange(meta.n_layers)[:, None] * meta.n_experts + by_expert) * meta.n_neurons).reshape(-1)
    a_table = (chunk.offsets, chunk.ids)
    p_table = a_table if chunk.pred_offsets is None or chunk.pred_ids is None else (chunk.pred_offsets, chunk.pred_ids)
    return TokenWork(experts, rows, base, meta.top_k, a_table, p_table)


@njit(cache=True)
def _gather_rows(offsets, ids, rows, base, top_k):
    """Flat keys of ``rows`` (in that order, row ``r`` offset by ``base[r]``) and each layer's
    bounds in the result (a layer is ``top_k`` consecutive rows)."""
    total = 0
    for r in rows:
        total += offsets[r + 1] - offsets[r]
    keys = np.empty(total, dtype=np.int64)
    bounds = np.zeros(rows.shape[0] // top_k + 1, dtype=np.int64)
    n = 0
    for j in range(rows.shape[0]):
        r = rows[j]
        b = base[j]
        for i in range(offsets[r], offsets[r + 1]):
            keys[n] = b + ids[i]
            n += 1
        if (j + 1) % top_k == 0:
            bounds[(j + 1) // top_k] = n
    return keys, bounds


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
    counts = np.zeros(n_keys, dtype=np.int32)  # at most one per token: int32 halves the counting pass's memory traffic
    for chunk in trace.chunks():
        if chunk.start >= stop:
            break
        lo_t, hi_t = max(start, chunk.start), min(stop, chunk.start + chunk.n_tokens)
        if lo_t >= hi_t:
            continue
        r0, r1 = chunk.row(lo_t, 0, 0), chunk.row(hi_t - 1, meta.n_layers - 1, meta.top_k - 1) + 1
        _add_counts(counts, chunk.offsets, chunk.ids, chunk.experts.reshape(-1), r0, r1, meta.top_k, meta.n_layers,
                    meta.n_experts, meta.n_neurons)
        if hi_t >= stop:
            break
    return counts


@njit(cache=True)
def _add_counts(counts, offsets, ids, experts, r0, r1, top_k, n_layers, n_experts, n_neurons):
    """counts[key] += 1 for every id of rows [r0, r1) (one pass, no key array built)."""
    for r in range(r0, r1):
        base = ((r // top_k) % n_layers * n_experts + np.int64(experts[r])) * n_neurons
        for i in range(offsets[r], offsets[r + 1]):
            counts[base + np.int64(ids[i])] += 1
