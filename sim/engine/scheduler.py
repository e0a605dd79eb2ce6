"""The scheduler: a token's CPU neurons partitioned into neuron clusters, and where they run.

[PI2 §4.2, §5] makes a neuron cluster the unit of work: the neurons of one FFN layer a
processor handles in one go, sized per processor. This module holds the partition and
names the placement rules; the knobs that drive both are strategy configuration
(``PowerInfer2Knobs``: ``cluster_neurons``, ``npu_activation_share``, ``compute_cores``,
``io_cores``, ``hot_share``), so a sweep or ``sim plan`` varies them like any run option.

- Routing (:func:`route_neurons`): each predicted neuron goes to the NPU (in its offline
  hot set), or to the CPU, where it is resident (hot region) or asks the cache (cold);
  whether it truly fired is what decides its Up/Down work.
- Partition (:func:`split_clusters`): per layer, the predicted neurons the CPU computes are
  cut into clusters of ``cluster_neurons``, resident neurons first (in their order), so
  compute starts while the I/O thread fetches the rest; the NPU takes the layer's hot
  share as one dense cluster (:func:`top_share`: the most active neurons of each expert
  covering ``npu_activation_share`` of its offline activations).
- Placement: a cluster goes to the fastest free compute thread (big core before mid
  before little, see :class:`sim.engine.machine.ThreadPool`), and waits first-come,
  first-served when none is free; its reads go to the I/O thread in arrival order.
  :mod:`sim.engine.cluster_schedule` applies these rules to a whole FFN phase.

Per cluster the partition gives: neurons, how many fired (their gate output was non-zero,
so their Up/Down rows are needed), how many miss the cache (Gate reads) and how many of
those fired (Up/Down reads). All layers of a token are routed and split in one compiled
call each.
"""

from __future__ import annotations

import numpy as np
from numba import njit

HOT, NPU = 1, 2  # bits of a neuron's placement byte
PLACEMENT = HOT | NPU  # the byte's upper bits hold route_neurons' call number (an active-set mark)
EPOCH_SHIFT = 2
MAX_EPOCH = (0xFF >> EPOCH_SHIFT)  # call numbers 1..63; 0 marks nothing


def placement_flags(is_hot: np.ndarray, is_npu: np.ndarray | None) -> np.ndarray:
    """One byte per neuron key: HOT if pinned in the hot region, NPU if the NPU computes it.
    One byte read per predicted neuron instead of one per set keeps routing cache-friendly."""
    flags = is_hot.astype(np.uint8) * np.uint8(HOT)
    if is_npu is not None:
        flags |= is_npu.astype(np.uint8) * np.uint8(NPU)
    return flags


@njit(cache=True)
def route_neurons(a_offsets, a_ids, p_offsets, p_ids, rows, base, per_layer, flags, epoch):
    """A token's predicted neurons, layer by layer, minus those the NPU computes.

    Reads the token's key rows straight from the trace chunk (see
    :meth:`~sim.engine.workload.TokenWork.key_rows`: row ``j``'s keys are
    ``ids[offsets[rows[j]]:offsets[rows[j] + 1]] + base[j]``, ``per_layer`` rows a layer)
    and each key's :func:`placement_flags` byte. Returns how many neurons were predicted,
    the per-layer offsets of the CPU's neurons (the predicted ones the NPU does not compute)
    and, per CPU neuron, whether it fired (is in the token's active set) and whether it sits
    in the pinned hot region, and the cold keys (in the same order) with their per-layer
    offsets: the requests the cache policy serves. The CPU's keys themselves are not kept:
    what follows needs only these flags. The loop is branch-free (every slot is written, the
    counts advance by 0 or 1): which way a neuron goes is random, so branches would
    mispredict about half the time.

    The active keys are marked with the call's number (``epoch[0]``, advanced here) in the
    flag byte's upper bits, so no pass clears them; every MAX_EPOCH calls the marks are
    cleared at once. (Telling fired from not by merging the row's two ascending id lists
    instead measured 1.2x slower in the engine, where the marks stay in cache; clearing a
    single FIRED bit after each call 1.07x slower than the call numbers.)
    """
    mark = epoch[0] + 1
    if mark > MAX_EPOCH:
        for k in range(flags.shape[0]):
            flags[k] &= np.uint8(PLACEMENT)
        mark = 1
    epoch[0] = mark
    marked = np.uint8(mark << EPOCH_SHIFT)
    n_rows = rows.shape[0]
    n_layers = n_rows // per_layer
    size = 0
    for j in range(n_rows):
        size += p_offsets[rows[j] + 1] - p_offsets[rows[j]]
    fired = np.empty(size, dtype=np.bool_)
    hot = np.empty(size, dtype=np.bool_)
    cold = np.empty(size, dtype=np.int64)
    cpu_offsets = np.zeros(n_layers + 1, dtype=np.int64)
    cold_offsets = np.zeros(n_layers + 1, dtype=np.int64)
    for j in range(n_rows):
        b = base[j]
        for i in range(a_offsets[rows[j]], a_offsets[rows[j] + 1]):
            k = b + a_ids[i]
            flags[k] = (flags[k] & np.uint8(PLACEMENT)) | marked
    n = 0
    m = 0
    for layer in range(n_layers):
        for j in range(layer * per_layer, (layer + 1) * per_layer):
            b = base[j]
            for i in range(p_offsets[rows[j]], p_offsets[rows[j] + 1]):
                k = b + p_ids[i]
                v = flags[k]
                h = np.int64(v & HOT)
                fired[n] = (v & np.uint8(~PLACEMENT & 0xFF)) == marked
                hot[n] = h != 0
                cold[m] = k
                keep = 1 - ((np.int64(v) & NPU) >> 1)
                n += keep
                m += keep & (1 - h)
        cpu_offsets[layer + 1] = n
        cold_offsets[layer + 1] = m
    return size, cpu_offsets, fired[:n], hot[:n], cold[:m], cold_offsets


@njit(cache=True)
def split_clusters(hot, cold_hit, fired, offsets, cold_offsets, cluster):
    """(cluster bounds per layer, neurons, fired, gate misses, up/down misses) as arrays, for
    the CPU neurons :func:`route_neurons` gave (``hot``, ``fired``, per-layer ``offsets``) and
    what the cache policy answered for their cold ones (``cold_hit``, per-layer ``cold_offsets``):
    a neuron is resident if hot or a hit."""
    n_layers = offsets.shape[0] - 1
    bounds = np.zeros(n_layers + 1, dtype=np.int64)
    for layer in range(n_layers):
        n = offsets[layer + 1] - offsets[layer]
        bounds[layer + 1] = bounds[layer] + (n + cluster - 1) // cluster
    total = bounds[n_layers]
    neurons = np.zeros(total, dtype=np.int64)
    n_fired = np.zeros(total, dtype=np.int64)
    gate_miss = np.zeros(total, dtype=np.int64)
    ud_miss = np.zeros(total, dtype=np.int64)
    last = cold_hit.shape[0] - 1
    for layer in range(n_layers):
        lo = offsets[layer]
        hi = offsets[layer + 1]
        j = cold_offsets[layer]  # the layer's next cold neuron's answer
        n_resident = (hi - lo) - (cold_offsets[layer + 1] - j)
        for c in range(j, cold_offsets[layer + 1]):
            n_resident += cold_hit[c]
        # Resident neurons fill clusters from the layer's first, the others from where they
        # end; each group's counts stay in registers until its cluster is full (one pass).
        c_res, pos_res, fired_res = bounds[layer], 0, 0
        c_miss, pos_miss = bounds[layer] + n_resident // cluster, n_resident % cluster
        n_miss, fired_miss = 0, 0
        for i in range(lo, hi):  # branch-free but for the rare cluster boundary
            h = hot[i]
            r = np.int64(h | cold_hit[max(min(j, last), 0)]) if last >= 0 else np.int64(h)  # j valid unless h
            j += np.int64(not h)
            miss = 1 - r
            f = np.int64(fired[i])
            pos_res += r
            fired_res += r & f
            pos_miss += miss
            n_miss += miss
            fired_miss += miss & f
            if pos_res == cluster:
                neurons[c_res] += cluster
                n_fired[c_res] += fired_res
                c_res, pos_res, fired_res = c_res + 1, 0, 0
            if pos_miss == cluster:
                neurons[c_miss] += n_miss
                n_fired[c_miss] += fired_miss
                gate_miss[c_miss] += n_miss
                ud_miss[c_miss] += fired_miss
                c_miss, pos_miss, n_miss, fired_miss = c_miss + 1, 0, 0, 0
        if pos_res:  # the last, partial clusters (resident and missing share one at the boundary)
            neurons[c_res] += pos_res
            n_fired[c_res] += fired_res
        if n_miss:
            neurons[c_miss] += n_miss
            n_fired[c_miss] += fired_miss
            gate_miss[c_miss] += n_miss
            ud_miss[c_miss] += fired_miss
    return bounds, neurons, n_fired, gate_miss, ud_miss


@njit(cache=True)
def top_share(counts, share):
    """Per row, the most counted entries (ties by index) that cover ``share`` of the row's
    total: in that order an entry is taken while the counts before it sum to less than
    ``share`` of the total, and only if its own count is positive.

    A counting sort per row (profile counts are small integers), linear in the entries;
    the taken entries are every one counted at least ``full`` plus the first ``partial``
    (by index) of those counted ``partial_c``.
    """
    n_rows, n = counts.shape
    out = np.zeros((n_rows, n), dtype=np.bool_)
    top = 0
    for r in range(n_rows):
        for i in range(n):
            top = max(top, counts[r, i])
    hist = np.zeros(top + 1, dtype=np.int64)
    for r in range(n_rows):
        hist[:] = 0
        total = 0
        for i in range(n):
            hist[counts[r, i]] += 1
            total += counts[r, i]
        limit = share * max(total, 1)
        before = 0  # counts of the entries ahead of the current one
        full = top + 1
        partial_c = 0
        partial = 0
        for c in range(top, 0, -1):
            k = hist[c]
            j = 0
            while j < k and before + j * c < limit:
                j += 1
            if j < k:
                partial_c, partial = c, j
                break
            before += k * c
            full = c
        for i in range(n):
            v = counts[r, i]
            if v >= full and v > 0:
                out[r, i] = True
            elif partial > 0 and v == partial_c:
                out[r, i] = True
                partial -= 1
    return out


@njit(cache=True)
def top_counted(counts, n, exclude):
    """The ``n`` most counted keys outside ``exclude`` (a mask, or empty for none), least counted
    first, ties in key order: the pinned hot set and the cache's preload order.

    A counting sort (profile counts are small integers), linear in the keys, where a
    selection by ``argpartition`` over the 3.7 M keys of Mixtral took ~25 ms a run and
    broke ties however its introselect happened to (numpy's choice, not a stated rule).
    Among keys counted as often as the last one taken, the lowest keys are taken: key
    order carries no meaning (a pool's neuron ids are a random permutation of its ranks).
    """
    masked = exclude.shape[0] == counts.shape[0]
    top = 0
    for i in range(counts.shape[0]):
        if not (masked and exclude[i]) and counts[i] > top:
            top = counts[i]
    hist = np.zeros(top + 2, dtype=np.int64)
    for i in range(counts.shape[0]):
        if not (masked and exclude[i]):
            hist[counts[i]] += 1
    taken = 0
    v = top
    while v > 0 and taken + hist[v] < n:  # the count of the last key taken
        taken += hist[v]
        v -= 1
    at_v = min(n - taken, hist[v])  # how many of the keys counted v are taken (the lowest)
    start = np.zeros(top + 2, dtype=np.int64)  # where each count's keys go: ascending counts
    start[v + 1] = at_v
    for c in range(v + 1, top + 1):
        start[c + 1] = start[c] + hist[c]
    out = np.empty(start[top + 1], dtype=np.int64)
    left_at_v = at_v
    for i in range(counts.shape[0]):
        if masked and exclude[i]:
            continue
        c = counts[i]
        if c > v:
            out[start[c]] = i
            start[c] += 1
        elif c == v and left_at_v > 0:
            out[start[v]] = i
            start[v] += 1
            left_at_v -= 1
    return out
