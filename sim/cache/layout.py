"""How a model's FFN neurons become cache items, and request streams in item space.

A neuron's cache key is ``((layer * n_experts) + expert) * n_neurons + neuron``. At
``cluster`` granularity consecutive neuron ids of one expert are grouped
``cluster_neurons`` at a time into one item that is loaded and evicted as a whole (the
last cluster of an expert may be smaller). With ``split="per-layer"`` the capacity is
divided evenly between layers and each layer has its own cache (partition); with
``shared`` one cache serves all layers.

A :class:`RequestBlock` is a CSR batch of steps in item space, the form the replay and
the policies consume; :meth:`CacheLayout.block` builds one from a trace chunk with a
few vectorised numpy passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from sim.errors import SimError
from sim.traces.format import Trace, TraceChunk, TraceMeta

GRANULARITIES = ("neuron", "cluster")
SPLITS = ("shared", "per-layer")


@dataclass
class RequestBlock:
    """Consecutive steps: ``items[offsets[s]:offsets[s+1]]`` are the items step s requests.

    ``weights`` (optional) says how many neuron requests each item request stands for
    (a cluster requested for 12 of its neurons has weight 12); hit and miss counts are
    reported in those units. ``step_part`` is the partition (layer, with a per-layer
    split) each step belongs to.
    """

    items: np.ndarray  # int64
    offsets: np.ndarray  # int64, n_steps + 1
    step_token: np.ndarray  # int64, n_steps
    step_part: np.ndarray  # int64, n_steps
    weights: np.ndarray | None = None  # int64 per request, None means 1

    @property
    def n_steps(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def n_requests(self) -> int:
        return int(self.items.shape[0] if self.weights is None else self.weights.sum())

    def item_counts(self, n_items: int) -> np.ndarray:
        """How many steps requested each item (the profile static-hot and pi2 use)."""
        return np.bincount(self.items, minlength=n_items)

    @staticmethod
    def concat(blocks: list[RequestBlock]) -> RequestBlock:
        if not blocks:
            return RequestBlock(np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64),
                                np.zeros(0, np.int64))
        items = np.concatenate([b.items for b in blocks])
        starts = np.cumsum([0] + [b.items.shape[0] for b in blocks[:-1]])
        offsets = np.concatenate([blocks[0].offsets[:1]] + [b.offsets[1:] + s for b, s in zip(blocks, starts,
                                                                                               strict=True)])
        weights = None
        if any(b.weights is not None for b in blocks):
            weights = np.concatenate([b.weights if b.weights is not None else np.ones(b.items.shape[0], np.int64)
                                      for b in blocks])
        return RequestBlock(items, offsets, np.concatenate([b.step_token for b in blocks]),
                            np.concatenate([b.step_part for b in blocks]), weights)


@dataclass(frozen=True)
class ItemSpace:
    """The items a cache may hold: count, bytes each, partitions, and the bytes that
    percentages of capacity refer to (all FFN neuron bytes, or all distinct keys)."""

    n_items: int
    item_bytes: np.ndarray
    n_parts: int = 1
    total_bytes: int = 0
    n_tokens: int = 0
    group_items: int | None = None  # items per (layer, expert): clusters never span two
    labels: np.ndarray | None = field(default=None, compare=False)  # original keys (CSV streams)

    @property
    def items_per_part(self) -> int:
        return self.n_items // self.n_parts


@dataclass(frozen=True)
class CacheLayout:
    """Mapping of a model's (layer, expert, neuron) onto cache items."""

    n_layers: int
    n_experts: int
    n_neurons: int
    neuron_bytes: int = 1
    granularity: str = "neuron"
    cluster_neurons: int = 1
    split: str = "shared"

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_experts", "n_neurons", "neuron_bytes", "cluster_neurons"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise SimError(f"must be a positive integer, got {value!r}", field=name)
        if self.granularity not in GRANULARITIES:
            raise SimError(f"must be one of {', '.join(GRANULARITIES)}; got {self.granularity!r}",
                           field="granularity")
        if self.split not in SPLITS:
            raise SimError(f"must be one of {', '.join(SPLITS)}; got {self.split!r}", field="split")

    @classmethod
    def from_meta(cls, meta: TraceMeta, *, neuron_bytes: int = 1, granularity: str = "neuron",
                  cluster_neurons: int = 32, split: str = "shared") -> CacheLayout:
        return cls(meta.n_layers, meta.n_experts, meta.n_neurons, int(neuron_bytes), granularity,
                   int(cluster_neurons) if granularity == "cluster" else 1, split)

    # -- sizes ---------------------------------------------------------------------------
    @property
    def units_per_expert(self) -> int:
        return -(-self.n_neurons // self.cluster_neurons)

    @property
    def n_items(self) -> int:
        return self.n_layers * self.n_experts * self.units_per_expert

    @property
    def n_parts(self) -> int:
        return self.n_layers if self.split == "per-layer" else 1

    @property
    def total_bytes(self) -> int:
        """Bytes of all FFN neurons: what ``capacity_pct`` is a percentage of."""
        return self.n_layers * self.n_experts * self.n_neurons * self.neuron_bytes

    def item_bytes(self) -> np.ndarray:
        per_unit = np.full(self.units_per_expert, self.cluster_neurons, dtype=np.int64)
        per_unit[-1] = self.n_neurons - self.cluster_neurons * (self.units_per_expert - 1)
        return np.tile(per_unit * self.neuron_bytes, self.n_layers * self.n_experts)

    def space(self, n_tokens: int = 0) -> ItemSpace:
        return ItemSpace(self.n_items, self.item_bytes(), self.n_parts, self.total_bytes, n_tokens,
                         self.units_per_expert)

    # -- keys ----------------------------------------------------------------------------
    def neuron_keys(self, layer: int, expert: int, neurons: np.ndarray) -> np.ndarray:
        """Flat neuron keys ``((layer * n_experts) + expert) * n_neurons + neuron``."""
        return (layer * self.n_experts + expert) * self.n_neurons + np.asarray(neurons, dtype=np.int64)

    def items_for(self, layer: int, expert: int, neurons: np.ndarray) -> np.ndarray:
        """Item ids of the given neurons (one per neuron; equal for neurons of one cluster)."""
        neurons = np.asarray(neurons, dtype=np.int64)
        return (layer * self.n_experts + expert) * self.units_per_expert + neurons // self.cluster_neurons

    def part_of(self, layer: int) -> int:
        return layer if self.split == "per-layer" else 0

    # -- streams -------------------------------------------------------------------------
    def check_meta(self, meta: TraceMeta, source: str = "<trace>") -> None:
        if (meta.n_layers, meta.n_experts, meta.n_neurons) != (self.n_layers, self.n_experts, self.n_neurons):
            raise SimError(f"trace has (layers, experts, neurons) = {(meta.n_layers, meta.n_experts, meta.n_neurons)}, "
                           f"the cache layout {(self.n_layers, self.n_experts, self.n_neurons)}", source=source)

    def block(self, chunk: TraceChunk) -> RequestBlock:
        """The chunk's steps (one per token, layer and chosen expert) in item space."""
        top_k = chunk.experts.shape[2]
        n_rows = chunk.offsets.shape[0] - 1
        rows = np.arange(n_rows, dtype=np.int64)
        layer = (rows // top_k) % self.n_layers
        group = layer * self.n_experts + chunk.experts.reshape(-1).astype(np.int64)
        counts = np.diff(chunk.offsets)
        row_of = np.repeat(rows, counts)
        ids = chunk.ids.astype(np.int64)
        step_token = chunk.start + rows // (self.n_layers * top_k)
        step_part = layer if self.split == "per-layer" else np.zeros(n_rows, dtype=np.int64)
        if self.granularity == "neuron":
            items = group[row_of] * self.n_neurons + ids
            return RequestBlock(items, chunk.offsets.astype(np.int64), step_token, step_part)
        items = group[row_of] * self.units_per_expert + ids // self.cluster_neurons
        # ids are sorted within a row, so a cluster's neurons are one run: keep its first.
        keep = np.ones(items.shape[0], dtype=bool)
        keep[1:] = (items[1:] != items[:-1]) | (row_of[1:] != row_of[:-1])
        first = np.flatnonzero(keep)
        weights = np.diff(np.append(first, items.shape[0])).astype(np.int64)
        kept_before = np.zeros(items.shape[0] + 1, dtype=np.int64)
        np.cumsum(keep, out=kept_before[1:])
        return RequestBlock(items[first], kept_before[chunk.offsets], step_token, step_part, weights)

    def blocks(self, trace: Trace) -> Iterator[RequestBlock]:
        src = str(trace.path) if trace.path else "<trace>"
        self.check_meta(trace.meta, src)
        for chunk in trace.chunks():
            yield self.block(chunk)


@njit(cache=True)
def gather_rows(values, offsets, order):
    """CSR rows ``order`` of ``values`` concatenated, and their new offsets."""
    n = 0
    for r in order:
        n += offsets[r + 1] - offsets[r]
    out = np.empty(n, dtype=values.dtype)
    new_off = np.zeros(order.shape[0] + 1, dtype=np.int64)
    j = 0
    for k in range(order.shape[0]):
        r = order[k]
        for i in range(offsets[r], offsets[r + 1]):
            out[j] = values[i]
            j += 1
        new_off[k + 1] = j
    return out, new_off
