"""What `sim plan` searches, as strategies declare it (Strategy.plan_space, sim/engine/strategies/search.py)
and the cache-policy registry marks it (CachePolicy.plan_candidate); no strategy or policy named here."""

from __future__ import annotations

from collections import Counter

import pytest

import sim
from sim.cache import POLICY_NAMES, policy_class
from sim.engine.neuron_cache import check_timed_policy, plan_policies
from sim.engine.strategies import REGISTRY
from sim.engine.strategies.base import parse_knobs
from sim.engine.strategies.search import core_layouts, family_knobs
from sim.explore.planner import plan
from sim.profiles.registry import bundled_names, load_device

PLANNABLE = sorted(name for name, cls in REGISTRY.items() if cls.plan_knobs)


@pytest.mark.parametrize("name", bundled_names("device"))
def test_core_layouts_never_oversubscribe_a_cluster(name):
    dev = load_device(name)
    cores = {c.name: c.cores for c in dev.cpu.clusters}
    layouts = core_layouts(dev)
    assert layouts[0] == {}  # the strategy's default comes first
    for layout in layouts[1:]:
        used = Counter(layout["compute_cores"]) + Counter(layout["io_cores"])
        assert all(used[c] <= cores[c] for c in used), layout
        assert len(layout["io_cores"]) == 1 and layout["compute_cores"]
    assert len({str(sorted(lay.items())) for lay in layouts}) == len(layouts)


@pytest.mark.parametrize("device", bundled_names("device"))
@pytest.mark.parametrize("strategy", PLANNABLE)
def test_a_plan_space_sets_only_the_declared_knobs_to_values_the_strategy_takes(strategy, device):
    cls = REGISTRY[strategy]
    space = cls.plan_space(load_device(device))
    assert space and len({name for name, _ in space}) == len(space)
    assert set().union(*(family_knobs(settings) for _, settings in space)) <= set(cls.plan_knobs)
    for _, settings in space:
        assert settings and len({str(sorted(s.items())) for s in settings}) == len(settings)
        for setting in settings:
            parse_knobs(cls, setting)  # raises for a value the knob model refuses


def _timed_run_takes(policy: str, keeps_profile: bool) -> bool:
    try:
        check_timed_policy(policy, keeps_profile)
    except sim.SimError:
        return False
    return True


@pytest.mark.parametrize("keeps_profile", [True, False])
def test_plan_policies_are_the_registry_candidates_a_timed_run_takes(keeps_profile):
    expected = [n for n in POLICY_NAMES if policy_class(n).plan_candidate and _timed_run_takes(n, keeps_profile)]
    assert plan_policies(keeps_profile) == expected and expected  # in the registry's order


def test_the_planner_refuses_a_strategy_that_declares_nothing_to_plan():
    unplannable = sorted(name for name, cls in REGISTRY.items() if not cls.plan_knobs)
    if not unplannable:
        pytest.skip("every strategy is plannable")
    with pytest.raises(sim.SimError, match="declares no knobs to plan") as err:
        plan(strategy=unplannable[0], memory_budget="12GB")
    assert err.value.field == "--strategy" and all(name in str(err.value) for name in PLANNABLE)
