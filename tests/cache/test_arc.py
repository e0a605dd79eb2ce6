"""ARC: adapts between recency and frequency."""

from __future__ import annotations

import numpy as np
from cache_helpers import csr

from sim.cache import make_policy
from sim.cache.arc import ARC


def test_scan_resistance_beats_lru():
    rng = np.random.default_rng(0)
    hot = [[int(k)] for k in rng.integers(0, 20, 3000)]
    scan = [[100 + i] for i in range(3000)]
    steps = [s for pair in zip(hot, scan, strict=True) for s in pair]
    items, offsets = csr(steps)
    arc = make_policy("arc", 30, 4000).run(items, offsets).hit.sum()
    lru = make_policy("lru", 30, 4000).run(items, offsets).hit.sum()
    assert arc > 1.3 * lru


def test_ghost_hit_in_b1_grows_the_recency_target():
    arc = ARC(4, 100)
    for k in (0, 0, 1, 2, 3, 4):  # 0 in T2; T1 = 1 2 3; 4 pushes 1 into B1
        arc.step([k])
    assert arc.p == 0.0 and 1 not in arc.resident().tolist()
    out = arc.step([1])
    assert not out.hit[0]
    assert arc.p > 0.0


def test_second_hit_promotes_to_t2_and_survives_a_burst_of_new_items():
    arc = ARC(4, 100)
    arc.step([7])
    arc.step([7])
    for k in range(10, 14):
        arc.step([k])
    assert 7 in arc.resident().tolist()
