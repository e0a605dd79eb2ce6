"""How the calibration's evaluator spreads a step's simulations over its workers (sim/calibrate/evaluator.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.calibrate.evaluator import balance

# groups of (point id, job number) keys with a run time each: one group per edited trace
groups_strategy = st.lists(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=8), min_size=1, max_size=6)


def _keys(times: list[list[float]]) -> tuple[list[list[tuple]], dict[tuple, float]]:
    groups = [[(f"p{g}", j) for j in range(len(ts))] for g, ts in enumerate(times)]
    return groups, {(f"p{g}", j): t for g, ts in enumerate(times) for j, t in enumerate(ts)}


@settings(max_examples=200, deadline=None)
@given(groups_strategy, st.integers(1, 8))
def test_every_job_runs_once_in_a_part_of_its_own_group(times, workers):
    groups, cost = _keys(times)
    parts = balance(groups, cost.__getitem__, workers)
    flat = [k for part in parts for k in part]
    assert sorted(flat) == sorted(cost) and all(parts)
    assert all(len({k[0] for k in part}) == 1 for part in parts)  # a part never mixes two traces
    loads = [sum(cost[k] for k in part) for part in parts]
    assert loads == sorted(loads, reverse=True)  # longest first: the pool's queue is LPT


@settings(max_examples=200, deadline=None)
@given(groups_strategy, st.integers(1, 8))
def test_a_group_within_a_workers_share_stays_whole(times, workers):
    """Splitting costs a second making of the trace, so only a group over a worker's share splits."""
    groups, cost = _keys(times)
    share = sum(cost.values()) / workers
    parts = balance(groups, cost.__getitem__, workers)
    for group in groups:
        pieces = [p for p in parts if p[0][0] == group[0][0]]
        if sum(cost[k] for k in group) <= share:
            assert len(pieces) == 1


def test_one_trace_holding_the_whole_step_is_shared_between_the_workers():
    groups, cost = _keys([[1.0, 1.0, 1.0, 1.0], [0.2]])
    parts = balance(groups, cost.__getitem__, 2)
    assert sorted(sum(cost[k] for k in p) for p in parts) == [0.2, 2.0, 2.0]
