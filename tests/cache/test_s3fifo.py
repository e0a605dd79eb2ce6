"""S3-FIFO: small probationary queue, main queue, ghost."""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import csr

from sim.cache import make_policy
from sim.cache.s3fifo import R_GHOST, R_MAIN, R_SMALL, S3FIFO
from sim.errors import SimError


def test_scan_resistance_beats_lru():
    rng = np.random.default_rng(0)
    hot = [[int(k)] for k in rng.integers(0, 20, 3000)]
    scan = [[100 + i] for i in range(3000)]
    steps = [s for pair in zip(hot, scan, strict=True) for s in pair]
    items, offsets = csr(steps)
    s3 = make_policy("s3fifo", 30, 4000).run(items, offsets).hit.sum()
    lru = make_policy("lru", 30, 4000).run(items, offsets).hit.sum()
    assert s3 > 1.3 * lru


def test_ghost_hit_goes_to_main():
    s3 = S3FIFO(20, 100)  # small queue 2, main 18, ghost 18
    for k in range(0, 25):  # fills main first (before any eviction), then small
        s3.step([k])
    ghosts = np.flatnonzero(s3._res == R_GHOST)
    assert ghosts.size > 0
    g = int(ghosts[0])
    out = s3.step([g])
    assert not out.hit[0] and s3._res[g] == R_MAIN


def test_new_items_enter_the_small_queue_once_it_has_evicted():
    s3 = S3FIFO(20, 100)
    for k in range(30):
        s3.step([k])
    s3.step([50])
    assert s3._res[50] == R_SMALL


def test_rejects_bad_ratios():
    with pytest.raises(SimError, match="small_size_ratio"):
        S3FIFO(20, 10, small_size_ratio=1.5)
