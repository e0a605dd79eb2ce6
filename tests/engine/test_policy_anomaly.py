"""Why the budget-monotonicity property is stated for stack policies only.

S3-FIFO is not a stack algorithm: a larger cache need not hold what a smaller one holds,
so a request can miss with more memory (Belady's anomaly). This pins the example
hypothesis found, so the restriction in test_engine_properties stays justified: the extra
miss comes from the policy (fewer hits at one token) and the engine turns it into a
slower token, as it should. (Found by a search over seeds and budgets; which example shows
the anomaly depends on the preload's order among equally counted neurons.)
"""

from __future__ import annotations

import engine_helpers as h
from test_engine_properties import budget_bytes, run, tps


def test_s3fifo_can_miss_more_with_a_bigger_budget_and_lru_cannot():
    dev = h.device()
    raw = h.TINY_DENSE
    results = {}
    for policy in ("s3fifo", "lru"):
        small = run(dev, raw, seed=7, memory_budget=budget_bytes(raw, dev, 0.0), policy=policy)
        large = run(dev, raw, seed=7, memory_budget=budget_bytes(raw, dev, 0.015625), policy=policy)
        assert large.summary["memory"]["neuron_cache"] > small.summary["memory"]["neuron_cache"]
        results[policy] = small, large
    small, large = results["s3fifo"]
    worse = large.tokens["hits"] < small.tokens["hits"]
    assert worse.any()  # a token that hits less with more memory
    slower = large.tokens["latency_s"] > small.tokens["latency_s"]
    assert (slower <= worse).all()  # and only such tokens get slower
    assert tps(large) < tps(small)
    small, large = results["lru"]
    assert (large.tokens["hits"] >= small.tokens["hits"]).all()
    assert tps(large) >= tps(small) * (1 - 1e-9)
