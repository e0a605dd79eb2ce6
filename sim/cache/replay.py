"""Replay request streams or whole traces through a policy: totals and per-token counts.

One policy instance serves each partition (one for a shared cache, one per layer with a
per-layer split, each with an equal share of the capacity). A block's steps are grouped
by partition with one CSR gather and each partition's steps go to its policy in a single
kernel call, so a replay costs a few numpy passes plus the kernel's per-request work.

Offline inputs are computed from the replayed stream itself unless given: Belady's
next-use times, and the request counts static-hot and pi2-segmented pick their hot sets
from (that is, by default their profile is the trace being replayed; pass a separate
profiling trace for an honest out-of-sample figure).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numba import njit

from sim.cache.base import MAX_CAPACITY_BYTES, CachePolicy, make_policy, policy_class, policy_options
from sim.cache.belady import next_use as compute_next_use
from sim.cache.layout import CacheLayout, ItemSpace, RequestBlock, gather_rows
from sim.checks import check_int
from sim.errors import SimError
from sim.traces.format import Trace


@dataclass(frozen=True)
class ReplayResult:
    """Totals of one replay (hits and misses in neuron requests) and per-token counts."""

    policy: str
    capacity_bytes: int
    per_token: pd.DataFrame  # token, requests, hits, misses, loaded_bytes

    @property
    def n_tokens(self) -> int:
        return int(self.per_token.shape[0])

    @property
    def requests(self) -> int:
        return int(self.per_token["requests"].sum())

    @property
    def hits(self) -> int:
        return int(self.per_token["hits"].sum())

    @property
    def misses(self) -> int:
        return int(self.per_token["misses"].sum())

    @property
    def loaded_bytes(self) -> int:
        return int(self.per_token["loaded_bytes"].sum())

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    @property
    def miss_ratio(self) -> float:
        return self.misses / self.requests if self.requests else 0.0

    @property
    def flash_bytes_per_token(self) -> float:
        return self.loaded_bytes / self.n_tokens if self.n_tokens else 0.0

    def after_warmup(self, warmup_tokens: int) -> ReplayResult:
        """The same replay counted from token ``warmup_tokens`` on (the cache still served
        the earlier tokens: this drops the cold-start misses from the figures)."""
        if warmup_tokens < 0 or (warmup_tokens and warmup_tokens >= self.n_tokens):
            raise SimError(f"must be in [0, {self.n_tokens}) tokens, got {warmup_tokens}", field="warmup_tokens")
        kept = self.per_token[self.per_token["token"] >= warmup_tokens].reset_index(drop=True)
        return ReplayResult(self.policy, self.capacity_bytes, kept)


_NO_WEIGHTS = np.zeros(0, dtype=np.int64)


def _split_capacity(capacity_bytes: int, n_parts: int) -> list[int]:
    base, extra = divmod(int(capacity_bytes), n_parts)
    return [base + (1 if p < extra else 0) for p in range(n_parts)]


@njit(cache=True)
def _step_totals(hit, loaded, weights, offsets):
    """Per step: neuron requests, neuron hits, bytes loaded (one pass over the block)."""
    n_steps = offsets.shape[0] - 1
    req = np.zeros(n_steps, dtype=np.int64)
    hits = np.zeros(n_steps, dtype=np.int64)
    ld = np.zeros(n_steps, dtype=np.int64)
    weighted = weights.shape[0] > 0
    for s in range(n_steps):
        r = 0
        h = 0
        b = 0
        for i in range(offsets[s], offsets[s + 1]):
            w = weights[i] if weighted else 1
            r += w
            if hit[i]:
                h += w
            b += loaded[i]
        req[s] = r
        hits[s] = h
        ld[s] = b
    return req, hits, ld


class Replayer:
    """Feeds blocks of a stream to per-partition policies and accumulates per-token counts."""

    def __init__(self, space: ItemSpace, policy: str, capacity_bytes: int, *,
                 profile_counts: np.ndarray | None = None, strict: bool = True, **options: Any):
        """``options`` are the policy's keyword options; with ``strict`` an option the
        policy does not take is an error (a comparison passes one option set to many
        policies and turns that off)."""
        cls = policy_class(policy)
        accepted = policy_options(cls)
        unknown = sorted(set(options) - set(accepted))
        if unknown and strict:
            raise SimError(f"{policy} does not take option(s) {unknown}; it takes: {', '.join(accepted) or 'none'}",
                           field="options")
        capacity_bytes = check_int(capacity_bytes, "capacity_bytes", 0, MAX_CAPACITY_BYTES)
        if cls.needs_profile and profile_counts is None:
            raise SimError(f"{policy} needs profile_counts", field="profile_counts")
        self.space = space
        self.policy_name = policy
        self.capacity_bytes = int(capacity_bytes)
        ipp = space.items_per_part
        self.policies: list[CachePolicy] = []
        for p, cap in enumerate(_split_capacity(capacity_bytes, space.n_parts)):
            opts = {k: v for k, v in options.items() if k in accepted}
            if profile_counts is not None and "profile_counts" in accepted:
                opts["profile_counts"] = np.asarray(profile_counts)[p * ipp:(p + 1) * ipp]
            if space.group_items is not None and "group_items" in accepted:
                opts.setdefault("group_items", space.group_items)
            self.policies.append(make_policy(policy, cap, ipp, space.item_bytes[p * ipp:(p + 1) * ipp],
                                             strict=False, **opts))
        n = max(space.n_tokens, 0)
        self._req = np.zeros(n, dtype=np.int64)
        self._hit = np.zeros(n, dtype=np.int64)
        self._loaded = np.zeros(n, dtype=np.int64)

    def feed(self, block: RequestBlock, next_use: np.ndarray | None = None) -> None:
        """Serve a block of steps (in stream order). ``next_use`` per request, if the
        policy needs it, must be measured in step indices of one consistent timeline."""
        ipp = self.space.items_per_part
        if self.space.n_parts == 1:
            parts = [(0, block.items, block.offsets, block.step_token, block.weights, next_use)]
        else:
            order = np.argsort(block.step_part, kind="stable")
            items, offsets = gather_rows(block.items, block.offsets, order)
            weights = None if block.weights is None else gather_rows(block.weights, block.offsets, order)[0]
            nu = None if next_use is None else gather_rows(next_use, block.offsets, order)[0]
            tokens = block.step_token[order]
            bounds = np.searchsorted(block.step_part[order], np.arange(self.space.n_parts + 1))
            parts = []
            for p in range(self.space.n_parts):
                s0, s1 = bounds[p], bounds[p + 1]
                if s1 == s0:
                    continue
                r0, r1 = offsets[s0], offsets[s1]
                parts.append((p, items[r0:r1] - p * ipp, offsets[s0:s1 + 1] - r0, tokens[s0:s1],
                              None if weights is None else weights[r0:r1], None if nu is None else nu[r0:r1]))
        for p, items, offsets, tokens, weights, nu in parts:
            out = self.policies[p].run(items, offsets, tokens=tokens, next_use=nu)
            req, hits, loaded = _step_totals(out.hit, out.loaded_bytes, _NO_WEIGHTS if weights is None else weights,
                                             offsets)
            n = self._req.shape[0]
            self._req += np.bincount(tokens, weights=req, minlength=n).astype(np.int64)
            self._hit += np.bincount(tokens, weights=hits, minlength=n).astype(np.int64)
            self._loaded += np.bincount(tokens, weights=loaded, minlength=n).astype(np.int64)

    def result(self) -> ReplayResult:
        per_token = pd.DataFrame({"token": np.arange(self._req.shape[0], dtype=np.int64), "requests": self._req,
                                  "hits": self._hit, "misses": self._req - self._hit,
                                  "loaded_bytes": self._loaded})
        return ReplayResult(self.policy_name, self.capacity_bytes, per_token)

    @property
    def used_bytes(self) -> int:
        return sum(p.used_bytes for p in self.policies)


def replay(space: ItemSpace, block: RequestBlock, policy: str, capacity_bytes: int, *,
           profile_counts: np.ndarray | None = None, **options: Any) -> ReplayResult:
    """Replay a whole in-memory stream; offline inputs come from the stream unless given."""
    cls = policy_class(policy)
    if cls.needs_profile and profile_counts is None:
        profile_counts = block.item_counts(space.n_items)
    nu = compute_next_use(block.items, block.offsets) if cls.needs_future else None
    rep = Replayer(space, policy, capacity_bytes, profile_counts=profile_counts, **options)
    rep.feed(block, nu)
    return rep.result()


def trace_stream(trace: Trace, layout: CacheLayout) -> tuple[ItemSpace, RequestBlock]:
    """The whole trace as one in-memory block (for Belady, or to replay it many times)."""
    return layout.space(trace.meta.n_tokens), RequestBlock.concat(list(layout.blocks(trace)))


def profile_counts_of(source: Trace | np.ndarray | None, layout: CacheLayout,
                      fallback: Iterable[RequestBlock] | None = None) -> np.ndarray | None:
    """Requests per item from a profiling trace (or given counts, or ``fallback`` blocks)."""
    if source is None:
        if fallback is None:
            return None
        counts = np.zeros(layout.n_items, dtype=np.int64)
        for b in fallback:
            counts += b.item_counts(layout.n_items)
        return counts
    if isinstance(source, Trace):
        return profile_counts_of(None, layout, layout.blocks(source))
    counts = np.asarray(source)
    if counts.shape != (layout.n_items,):
        raise SimError(f"profile counts must have {layout.n_items} entries, got shape {counts.shape}",
                       field="profile")
    return counts


def replay_trace(trace: Trace, policy: str, capacity_bytes: int, *, neuron_bytes: int = 1,
                 granularity: str = "neuron", cluster_neurons: int = 32, split: str = "shared",
                 profile: Trace | np.ndarray | None = None, **options: Any) -> ReplayResult:
    """Replay a trace through ``policy`` with ``capacity_bytes`` of cache.

    Keys are (layer, expert, neuron) flattened as in :class:`~sim.cache.layout.CacheLayout`;
    each neuron is ``neuron_bytes`` bytes. Online policies stream the trace chunk by
    chunk (memory bounded by one chunk); Belady needs the whole future and holds the
    stream in memory (about 16 bytes per neuron request).
    """
    layout = CacheLayout.from_meta(trace.meta, neuron_bytes=neuron_bytes, granularity=granularity,
                                   cluster_neurons=cluster_neurons, split=split)
    cls = policy_class(policy)
    if cls.needs_future:
        space, block = trace_stream(trace, layout)
        counts = profile_counts_of(profile, layout, [block]) if cls.needs_profile else None
        return replay(space, block, policy, capacity_bytes, profile_counts=counts, **options)
    counts = profile_counts_of(profile, layout, layout.blocks(trace)) if cls.needs_profile else None
    rep = Replayer(layout.space(trace.meta.n_tokens), policy, capacity_bytes, profile_counts=counts, **options)
    for block in layout.blocks(trace):
        rep.feed(block)
    return rep.result()
