"""The scheduler: a token's CPU neurons partitioned into neuron clusters, and where they run.

[PI2 §4.2, §5] makes a neuron cluster the unit of work: the neurons of one FFN layer a
processor handles in one go, sized per processor. This module holds the partition and
names the placement rules; the knobs that drive both are strategy configuration
(``PowerInfer2Knobs``: ``cluster_neurons``, ``npu_activation_share``, ``compute_cores``,
``io_cores``, ``hot_share``), so a sweep or ``sim plan`` varies them like any run option.

- Partition (:func:`split_clusters`): per layer, the predicted neurons the CPU computes are
  cut into clusters of ``cluster_neurons``, resident neurons first (in their order), so
  compute starts while the I/O thread fetches the rest; the NPU takes the layer's hot
  share as one dense cluster (``npu_activation_share`` of the offline activations).
- Placement: a cluster goes to the fastest free compute thread (big core before mid
  before little, see :class:`sim.engine.machine.ThreadPool`), and waits first-come,
  first-served when none is free; its reads go to the I/O thread in arrival order.
  :mod:`sim.engine.cluster_schedule` applies these rules to a whole FFN phase.

Per cluster the partition gives: neurons, how many fired (their gate output was non-zero,
so their Up/Down rows are needed), how many miss the cache (Gate reads) and how many of
those fired (Up/Down reads). All layers of a token are split in one compiled call.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def split_clusters(resident, fired, offsets, cluster):
    """(cluster bounds per layer, neurons, fired, gate misses, up/down misses) as arrays."""
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
    for layer in range(n_layers):
        lo = offsets[layer]
        hi = offsets[layer + 1]
        base = bounds[layer]
        p = 0
        for want_resident in (True, False):  # resident neurons first, each group in order
            for i in range(lo, hi):
                if resident[i] != want_resident:
                    continue
                c = base + p // cluster
                neurons[c] += 1
                if fired[i]:
                    n_fired[c] += 1
                if not want_resident:
                    gate_miss[c] += 1
                    if fired[i]:
                        ud_miss[c] += 1
                p += 1
    return bounds, neurons, n_fired, gate_miss, ud_miss
