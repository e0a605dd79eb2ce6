"""Every layer's CPU neurons of one token split into neuron clusters, in one compiled call.

A cluster takes ``cluster`` consecutive neurons of its layer, resident neurons first (in
their order) so compute starts while the I/O thread fetches the rest [PI2 §4.2, §5].
Per cluster: neurons, how many fired (their gate output was non-zero, so their Up/Down rows
are needed), how many miss the cache (Gate reads) and how many of those fired (Up/Down
reads). The same split as :func:`sim.engine.strategies.powerinfer2.cluster_arrays` for one
layer (a test compares them); doing all layers at once saves the per-layer numpy calls.
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
