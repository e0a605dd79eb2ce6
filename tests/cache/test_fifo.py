"""FIFO: insertion order only; hits do not refresh."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from cache_helpers import random_steps

from sim.cache.fifo import FIFO


def reference_fifo(steps, capacity):
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for keys in steps:
        step_hits = [k in cache for k in keys]
        pinned = set(k for k, h in zip(keys, step_hits, strict=True) if h)
        for k, hit in zip(keys, step_hits, strict=True):
            if hit or len(pinned) >= capacity:
                continue
            if len(cache) >= capacity:
                victim = next(v for v in cache if v not in pinned)  # oldest unpinned
                del cache[victim]
            cache[k] = None
            pinned.add(k)
        hits.extend(step_hits)
    return np.array(hits)


def test_hits_do_not_refresh():
    fifo = FIFO(3, 10)
    for k in (1, 2, 3, 1):
        fifo.step([k])
    assert fifo.step([4]).evicted.tolist() == [1]


def test_matches_reference_model_with_pinned_hits_anywhere_in_the_queue():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(4, 40))
        steps = random_steps(rng, n, 200, max_step=6)
        capacity = int(rng.integers(1, n + 1))
        fifo = FIFO(capacity, n)
        got = np.concatenate([fifo.step(np.array(s)).hit for s in steps])
        np.testing.assert_array_equal(got, reference_fifo(steps, capacity))
