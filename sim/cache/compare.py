"""Miss-ratio curves: replay one stream through several policies at several cache sizes.

The result is a tidy DataFrame, one row per (policy, capacity), with the capacity both in
bytes and as a percentage of all item bytes (all FFN weights for a trace, all distinct
keys for a request CSV), hits and misses in neuron requests, and the flash bytes read
per token. :func:`sim.plots.plot_cache_comparison` draws it.

The stream is built once and held in memory, and the offline inputs (Belady's next-use
times, the static-hot / pi2-segmented profile) are computed once for all runs.

Belady bounds the misses of every policy that loads only what a step requests. Policies
that load whole clusters (pi2-segmented's hot region, ``cluster`` granularity) prefetch
the cluster's other neurons, so their neuron hit ratio can exceed Belady's; their flash
bytes per token (which count the whole clusters) cannot go below Belady's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.cache import POLICY_NAMES
from sim.cache.base import POLICIES, policy_class, policy_options
from sim.cache.belady import next_use as compute_next_use
from sim.cache.layout import CacheLayout, ItemSpace, RequestBlock
from sim.cache.replay import Replayer, profile_counts_of, trace_stream
from sim.cache.requests import read_requests_csv
from sim.checks import check_int
from sim.errors import SimError
from sim.traces.format import Trace, require_tokens
from sim.units import SizeSpec, parse_size_or_percent

COLUMNS = ["policy", "capacity_bytes", "capacity_pct", "requests", "hits", "misses", "hit_ratio", "miss_ratio",
           "loaded_bytes", "tokens", "flash_bytes_per_token"]


def parse_policies(text: str | Sequence[str]) -> list[str]:
    """``"lru,s3fifo"`` or a list -> validated policy names (``all`` means every policy)."""
    if not isinstance(text, str) and not (isinstance(text, Sequence) and all(isinstance(n, str) for n in text)):
        raise SimError(f"expected policy names (\"lru,s3fifo\" or a list), got {type(text).__name__}",
                       field="--policies")
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else [n.strip() for n in text]
    names = [n for n in names if n]
    if names == ["all"]:
        return list(POLICY_NAMES)
    if not names:
        raise SimError("give at least one policy", field="--policies")
    for n in names:
        if n not in POLICY_NAMES:
            raise SimError(f"unknown policy {n!r}; available: {', '.join(POLICY_NAMES)}", field="--policies")
    return list(dict.fromkeys(names))


def resolve_sizes(sizes: str | Sequence[str | int | SizeSpec], total_bytes: int) -> list[int]:
    """Sizes as bytes (``50``, ``2MiB``) or percentages of ``total_bytes`` -> sorted bytes.

    A byte size above ``total_bytes`` is refused: a cache larger than everything it could
    hold measures nothing, and its "% of items" (thousands of percent) reads as a typo.
    """
    if isinstance(sizes, bytes) or not isinstance(sizes, str | Sequence):  # b"x" iterated as numbers
        raise SimError(f"expected sizes (\"10%,2MiB\" or a list), got {type(sizes).__name__}", field="--sizes")
    items = [s.strip() for s in sizes.split(",")] if isinstance(sizes, str) else list(sizes)
    items = [s for s in items if not (isinstance(s, str) and not s)]
    if not items:
        raise SimError("give at least one cache size", field="--sizes")
    out = []
    for s in items:
        spec = s if isinstance(s, SizeSpec) else parse_size_or_percent(s, field="--sizes")
        cap = spec.resolve(total_bytes)
        if cap > total_bytes:
            raise SimError(f"must be in [1, {total_bytes:,}] bytes (100% = all item bytes) or (0, 100]%, "
                           f"got {str(s)!r} = {cap:,} B", field="--sizes")
        out.append(cap)
    return sorted(set(out))


def miss_ratio_curves(space: ItemSpace, block: RequestBlock, policies: Sequence[str], sizes: Sequence[Any] | str,
                      *, profile_counts: np.ndarray | None = None, warmup_tokens: int = 0,
                      **options: Any) -> pd.DataFrame:
    """Replay ``block`` for every policy and capacity; one row per (policy, capacity).

    The first ``warmup_tokens`` tokens are served but not counted (``tokens`` and the
    per-token figures then refer to the rest), to measure the steady state.
    """
    names = parse_policies(policies)
    caps = resolve_sizes(sizes, space.total_bytes)
    classes = [policy_class(n) for n in names]
    known = {name for cls in POLICIES.values() for name in policy_options(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise SimError(f"no policy takes option(s) {unknown}; options: {', '.join(sorted(known))}", field="options")
    nu = compute_next_use(block.items, block.offsets) if any(c.needs_future for c in classes) else None
    if profile_counts is None and any(c.needs_profile for c in classes):
        profile_counts = block.item_counts(space.n_items)
    warmup_tokens = check_int(warmup_tokens, "--warmup-tokens")
    if not 0 <= warmup_tokens < max(space.n_tokens, 1):
        raise SimError(f"must be in [0, {space.n_tokens}) for a stream of {space.n_tokens} tokens, "
                       f"got {warmup_tokens}", field="--warmup-tokens")
    rows = []
    n_tokens = space.n_tokens - warmup_tokens
    for name, cls in zip(names, classes, strict=True):
        for cap in caps:
            rep = Replayer(space, name, cap, profile_counts=profile_counts if cls.needs_profile else None,
                           strict=False, **options)
            rep.feed(block, nu if cls.needs_future else None)
            r = rep.result().after_warmup(warmup_tokens)
            rows.append({"policy": name, "capacity_bytes": cap,
                         "capacity_pct": 100.0 * cap / space.total_bytes if space.total_bytes else float("nan"),
                         "requests": r.requests, "hits": r.hits, "misses": r.misses, "hit_ratio": r.hit_ratio,
                         "miss_ratio": r.miss_ratio, "loaded_bytes": r.loaded_bytes, "tokens": n_tokens,
                         "flash_bytes_per_token": r.loaded_bytes / n_tokens if n_tokens else 0.0})
    return pd.DataFrame(rows, columns=COLUMNS)


def compare_trace(trace: Trace, policies: Sequence[str] | str, sizes: Sequence[Any] | str, *,
                  neuron_bytes: int = 1, granularity: str = "neuron", cluster_neurons: int = 32,
                  split: str = "shared", profile: Trace | np.ndarray | None = None,
                  **options: Any) -> pd.DataFrame:
    """Miss-ratio curves of a trace (a Trace, or a trace file's path); percentages are of
    all FFN neuron bytes."""
    if isinstance(trace, str | Path):
        trace = Trace.load(trace)
    if not isinstance(trace, Trace):
        raise SimError(f"expected a Trace or a trace file path, got {type(trace).__name__}", field="trace")
    require_tokens(trace, "a cache comparison")  # else hit and miss ratios are both 0
    neuron_bytes = check_int(neuron_bytes, "--neuron-bytes", 1)
    names = parse_policies(policies)
    if "pi2-segmented" in names and granularity != "neuron":
        raise SimError("pi2-segmented has its own granularity (hot clusters, cold neurons); "
                       "compare it with --granularity neuron", field="--granularity")
    layout = CacheLayout.from_meta(trace.meta, neuron_bytes=neuron_bytes, granularity=granularity,
                                   cluster_neurons=cluster_neurons, split=split)
    space, block = trace_stream(trace, layout)
    counts = profile_counts_of(profile, layout) if profile is not None else None
    # One cluster size serves both the layout and pi2-segmented's hot clusters.
    return miss_ratio_curves(space, block, names, sizes, profile_counts=counts, cluster_neurons=cluster_neurons,
                             **options)


def compare_requests(path: str | Path, policies: Sequence[str] | str, sizes: Sequence[Any] | str,
                     **options: Any) -> pd.DataFrame:
    """Miss-ratio curves of a ``step,key[,size]`` CSV; percentages are of all keys' bytes."""
    space, block = read_requests_csv(path)
    return miss_ratio_curves(space, block, policies, sizes, **options)
