"""PowerInfer-2's segmented neuron cache (Xue et al. 2024, sec. 5): a hot region managed
as LRU over *clusters* of hot neurons and a cold region managed as LRU over single
neurons. Evicted weights are dropped.

Which neurons are hot comes from a profile (requests per neuron): the most requested
neurons whose bytes fill ``hot_set_factor`` times the hot region. Within each group of
``group_items`` consecutive item ids (one expert of one layer, since a step never spans
two) the hot neurons are packed, hottest first, into clusters of ``cluster_neurons``;
requesting any neuron of a hot cluster loads (or hits) the whole cluster. The split of
the capacity (``hot_fraction``) and the cluster size are what PowerInfer-2's offline
planner chooses; the defaults here (half the cache hot, 32-neuron clusters, a hot set
exactly the size of the hot region) are assumptions, not figures from the paper.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.cache.base import MAX_ITEMS, CachePolicy, RunResult, check_counts, int64_bytes, register
from sim.cache.lru import LRU
from sim.cache.static_hot import hot_set
from sim.checks import check_int, check_real


@njit(cache=True)
def _split(items, offsets, cluster_of, seen, hidx, stamp0):
    """Split a block into hot-cluster requests (one per cluster per step) and cold
    neuron requests. Returns CSR arrays for both plus, per request, whether it is hot
    and its index in the hot or cold arrays."""
    n = items.shape[0]
    n_steps = offsets.shape[0] - 1
    hot_items = np.empty(n, dtype=np.int64)
    hot_first = np.empty(n, dtype=np.int64)
    hot_off = np.zeros(n_steps + 1, dtype=np.int64)
    cold_items = np.empty(n, dtype=np.int64)
    cold_req = np.empty(n, dtype=np.int64)
    cold_off = np.zeros(n_steps + 1, dtype=np.int64)
    is_hot = np.zeros(n, dtype=np.bool_)
    where = np.empty(n, dtype=np.int64)
    nh = 0
    nc = 0
    for s in range(n_steps):
        stamp = stamp0 + s
        for i in range(offsets[s], offsets[s + 1]):
            x = items[i]
            c = cluster_of[x]
            if c >= 0:
                is_hot[i] = True
                if seen[c] != stamp:
                    seen[c] = stamp
                    hidx[c] = nh
                    hot_items[nh] = c
                    hot_first[nh] = i
                    nh += 1
                where[i] = hidx[c]
            else:
                cold_items[nc] = x
                cold_req[nc] = i
                where[i] = nc
                nc += 1
        hot_off[s + 1] = nh
        cold_off[s + 1] = nc
    return hot_items[:nh], hot_first[:nh], hot_off, cold_items[:nc], cold_req[:nc], cold_off, is_hot, where


def hot_clusters(counts: np.ndarray, item_bytes: np.ndarray, hot_bytes: int, cluster_neurons: int,
                 group_items: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cluster id per item (-1 for cold), bytes per cluster, and members CSR offsets
    (members are ``np.argsort`` of the ids, see :meth:`Pi2Segmented.cluster_members`)."""
    n = counts.shape[0]
    order = np.lexsort((np.arange(n), -counts.astype(np.float64)))
    order = order[counts[order] > 0]
    order = order[hot_set(counts, item_bytes, hot_bytes)[order]]  # keeps the hottest-first order
    # Stable by group: inside a group the hottest neurons come first.
    order = order[np.argsort(order // group_items, kind="stable")]
    group = order // group_items
    new_group = np.ones(order.shape[0], dtype=bool)
    new_group[1:] = group[1:] != group[:-1]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(order.shape[0]), 0))
    pos = np.arange(order.shape[0]) - group_start
    starts = new_group | (pos % cluster_neurons == 0)
    cid = np.cumsum(starts) - 1
    cluster_of = np.full(n, -1, dtype=np.int64)
    cluster_of[order] = cid
    n_clusters = int(cid[-1]) + 1 if cid.size else 0
    cluster_bytes = np.bincount(cid, weights=item_bytes[order], minlength=n_clusters).astype(np.int64)
    return cluster_of, cluster_bytes, order


@register("pi2-segmented", "PowerInfer-2 segmented cache: hot clusters (LRU) + cold neurons (LRU)")
class Pi2Segmented(CachePolicy):
    """PowerInfer-2's segmented cache: cluster-level LRU hot region, neuron-level LRU cold region."""

    needs_profile = True
    neuron_keys_only = True  # hot clusters and cold neurons are its own granularity
    item_arrays = False  # the two LRU regions hold the state

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1, *,
                 profile_counts: np.ndarray | None = None, hot_fraction: float = 0.5, cluster_neurons: int = 32,
                 group_items: int | None = None, hot_set_factor: float = 1.0):
        super().__init__(capacity_bytes, n_items, item_bytes)
        counts = check_counts(profile_counts, self.n_items, "pi2-segmented")
        fraction = check_real(hot_fraction, "hot_fraction", 0.0, 1.0)
        cluster = check_int(cluster_neurons, "cluster_neurons", 1, MAX_ITEMS)
        factor = check_real(hot_set_factor, "hot_set_factor", 0.0, lo_open=True)
        group = self.n_items if group_items is None else check_int(group_items, "group_items", 1, MAX_ITEMS)
        hot_cap = int(self.capacity_bytes * fraction)
        self.hot_capacity_bytes = hot_cap
        self.cold_capacity_bytes = self.capacity_bytes - hot_cap
        # a hot-set budget beyond int64 bytes selects every profiled neuron either way
        hot_set_bytes = int64_bytes(hot_cap * factor)
        self._cluster_of, self._cluster_bytes, members = hot_clusters(
            counts, self.item_bytes, hot_set_bytes, cluster, max(group, 1))
        n_clusters = self._cluster_bytes.shape[0]
        self._members = members
        self._member_off = np.zeros(n_clusters + 1, dtype=np.int64)
        np.cumsum(np.bincount(self._cluster_of[members], minlength=n_clusters), out=self._member_off[1:])
        self.hot = LRU(hot_cap, n_clusters, np.maximum(self._cluster_bytes, 1))
        self.cold = LRU(self.cold_capacity_bytes, self.n_items, self.item_bytes)
        self._seen = np.full(n_clusters, -1, dtype=np.int64)
        self._hidx = np.zeros(n_clusters, dtype=np.int64)
        self._stamp = 0

    @property
    def n_clusters(self) -> int:
        return int(self._cluster_bytes.shape[0])

    @property
    def cluster_of(self) -> np.ndarray:
        return self._cluster_of

    @property
    def used_bytes(self) -> int:
        return self.hot.used_bytes + self.cold.used_bytes

    @property
    def steps_done(self) -> int:
        return self.cold.steps_done

    def resident_mask(self) -> np.ndarray:
        mask = self.cold.resident_mask().copy()
        hot_res = self.hot.resident_mask()
        is_hot = self._cluster_of >= 0
        mask[is_hot] |= hot_res[self._cluster_of[is_hot]]
        return mask

    def cluster_members(self, c: int) -> np.ndarray:
        return self._members[self._member_off[c]:self._member_off[c + 1]]

    def _run_block(self, items, sizes, offsets, tokens, next_use, record) -> RunResult:
        h_items, h_first, h_off, c_items, c_req, c_off, is_hot, where = _split(
            items, offsets, self._cluster_of, self._seen, self._hidx, self._stamp)
        self._stamp += offsets.shape[0] - 1
        h_sizes = self._cluster_bytes[h_items]
        h = self.hot.run(h_items, h_off, sizes=h_sizes, tokens=tokens, record_evictions=record)
        c = self.cold.run(c_items, c_off, sizes=sizes[c_req], tokens=tokens, record_evictions=record)
        hit = np.empty(items.shape[0], dtype=np.bool_)
        hit[is_hot] = h.hit[where[is_hot]]
        hit[~is_hot] = c.hit[where[~is_hot]]
        loaded = np.zeros(items.shape[0], dtype=np.int64)
        loaded[h_first] = h.loaded_bytes  # a cluster's read is charged to its first request
        loaded[c_req] = c.loaded_bytes
        evicted = None
        if record:
            assert h.evicted is not None and c.evicted is not None
            parts = [self.cluster_members(int(k)) for k in h.evicted]
            evicted = np.concatenate([*parts, c.evicted]).astype(np.int64) if parts else c.evicted
        return RunResult(hit, evicted, h.n_evicted + c.n_evicted, loaded=loaded)

    def _run(self, items, sizes, offsets, tokens, next_use, hit, evbuf, record):  # pragma: no cover
        raise NotImplementedError("composite policy: see _run_block")
