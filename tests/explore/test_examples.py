"""The example specs under examples/ expand to runnable points that pass the up-front checks (no simulation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.explore.point_checks import check_points
from sim.explore.sweep import spec_points

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_the_issue_examples_exist():
    assert {"fig10_budgets.yaml", "mixtral_dram_vs_ufs.yaml", "cache_policies.yaml"} <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_points_all_resolve(path):
    points, source = spec_points(path)
    assert points and all(p.error is None for p in points), [p.error for p in points if p.error][:1]
    check_points(points, source)  # the up-front checks of `sim sweep` pass too
    if path.stem == "fig10_budgets":
        assert len(points) == 42  # 14 budgets x 3 strategies
        assert {p.task["run"]["decode_tokens"] for p in points} == {128}
        assert {p.task["strategy"] for p in points} == {"powerinfer2", "llm-in-flash", "llamacpp"}
