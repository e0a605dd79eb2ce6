"""A cache over a model's key layout, served one (token, layer, expert) step at a time.

Not the engine's cache (that is :class:`sim.engine.neuron_cache.NeuronCache`, which batches
a token's cold keys through one policy): this per-step view checks the whole-trace replay
of :mod:`sim.cache.replay` step by step in the tests and measures a per-step call in
``benchmarks/cache_replay.py``. :class:`StepwiseCache` maps a step's active neuron ids to items of its
:class:`~sim.cache.layout.CacheLayout` (clusters are deduplicated), routes the step to
the layer's partition and reports hits and misses per neuron plus the bytes to read from
flash. The mapping is a couple of numpy operations on the step's ids, so a call costs a
few microseconds plus the policy kernel's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.cache.base import MAX_CAPACITY_BYTES, CachePolicy, make_policy, policy_class, policy_options
from sim.cache.belady import Belady
from sim.cache.layout import CacheLayout, gather_rows
from sim.cache.replay import _split_capacity, profile_counts_of
from sim.checks import check_int, int_array
from sim.errors import SimError
from sim.traces.format import Trace


@dataclass(frozen=True, slots=True)
class NeuronStepResult:
    """One step's outcome in neuron terms."""

    hit: np.ndarray  # bool per requested neuron (in the order given)
    loaded_bytes: int  # bytes read from flash (whole clusters at cluster granularity)
    evicted_items: np.ndarray  # item ids (in the layout's item space) evicted by the step

    @property
    def hits(self) -> int:
        return int(np.count_nonzero(self.hit))

    @property
    def misses(self) -> int:
        return int(self.hit.shape[0] - np.count_nonzero(self.hit))


class StepwiseCache:
    """A neuron cache for one model layout and policy; capacity shared or split per layer."""

    def __init__(self, layout: CacheLayout, policy: str, capacity_bytes: int, *,
                 profile: Trace | np.ndarray | None = None, **options: Any):
        cls = policy_class(policy)
        if cls.neuron_keys_only and layout.granularity != "neuron":
            raise SimError(f"{cls.name} has its own granularity (hot clusters, cold neurons); "
                           "use granularity 'neuron'", field="granularity")
        if cls.needs_profile and profile is None:
            raise SimError(f"{policy} needs a profile (a profiling trace or per-item request counts)",
                           field="profile")
        self.layout = layout
        self.policy_name = policy
        self.capacity_bytes = check_int(capacity_bytes, "capacity_bytes", 0, MAX_CAPACITY_BYTES)
        counts = profile_counts_of(profile, layout) if cls.needs_profile else None
        ipp = layout.n_items // layout.n_parts
        item_bytes = layout.item_bytes()
        accepted = policy_options(cls)
        self.parts: list[CachePolicy] = []
        for p, cap in enumerate(_split_capacity(capacity_bytes, layout.n_parts)):
            opts = dict(options)  # the user's options: make_policy rejects any the policy does not take
            if counts is not None:
                opts["profile_counts"] = counts[p * ipp:(p + 1) * ipp]
            if "group_items" in accepted:
                opts.setdefault("group_items", layout.units_per_expert)
            self.parts.append(make_policy(policy, cap, ipp, item_bytes[p * ipp:(p + 1) * ipp], **opts))
        self._ipp = ipp

    @classmethod
    def for_trace(cls, trace: Trace, policy: str, capacity_bytes: int, *, neuron_bytes: int = 1,
                  granularity: str = "neuron", cluster_neurons: int = 32, split: str = "shared",
                  profile: Trace | np.ndarray | None = None, **options: Any) -> StepwiseCache:
        """A cache sized for ``trace``'s model. For static-hot/pi2 the profile defaults to
        the trace itself; for Belady the trace is the future, and steps must then be
        served in the trace's row order (token, layer, expert slot)."""
        layout = CacheLayout.from_meta(trace.meta, neuron_bytes=neuron_bytes, granularity=granularity,
                                       cluster_neurons=cluster_neurons, split=split)
        cls_ = policy_class(policy)
        if cls_.needs_profile and profile is None:
            profile = trace
        cache = cls(layout, policy, capacity_bytes, profile=profile, **options)
        if cls_.needs_future:
            cache.prepare(trace)
        return cache

    def prepare(self, trace: Trace) -> None:
        """Hand Belady the future: the trace's steps, in row order."""
        if not all(isinstance(policy, Belady) for policy in self.parts):
            raise SimError(f"{self.policy_name} does not use the future", field="policy")
        blocks = list(self.layout.blocks(trace))
        for p, policy in enumerate(self.parts):
            assert isinstance(policy, Belady)
            items_l, offs_l = [], []
            for b in blocks:
                sel = np.flatnonzero(b.step_part == p)
                items, offsets = gather_rows(b.items, b.offsets, sel)
                items_l.append(items - p * self._ipp)
                offs_l.append(offsets)
            starts = np.cumsum([0] + [i.shape[0] for i in items_l[:-1]])
            offsets = np.concatenate([np.zeros(1, np.int64)] + [o[1:] + s for o, s in zip(offs_l, starts,
                                                                                         strict=True)])
            policy.prepare(np.concatenate(items_l) if items_l else np.zeros(0, np.int64), offsets)

    @property
    def used_bytes(self) -> int:
        return sum(p.used_bytes for p in self.parts)

    def step(self, layer: int, expert: int, neurons: np.ndarray, *, token: int | None = None) -> NeuronStepResult:
        """Serve the active ``neurons`` (unique ids) of ``expert`` in ``layer`` for one token."""
        lay = self.layout
        layer = check_int(layer, "layer", 0, lay.n_layers - 1)
        expert = check_int(expert, "expert", 0, lay.n_experts - 1)
        neurons = np.ascontiguousarray(int_array(neurons, "neurons", "an array of integer neuron ids"),
                                       dtype=np.int64).reshape(-1)
        if neurons.size and (neurons.min() < 0 or neurons.max() >= lay.n_neurons):
            raise SimError(f"neuron ids must be in [0, {lay.n_neurons})", field="neurons")
        part = lay.part_of(layer)
        items = lay.items_for(layer, expert, neurons) - part * self._ipp
        if lay.granularity == "cluster":
            uniq, inverse = np.unique(items, return_inverse=True)
        else:
            uniq, inverse = items, None
        out = self.parts[part].step(uniq, token=token)
        hit = out.hit if inverse is None else out.hit[inverse.reshape(-1)]
        return NeuronStepResult(hit, out.loaded_bytes, out.evicted + part * self._ipp)
