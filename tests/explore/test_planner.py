"""The planner: sensible core layouts, and never slower than the default configuration.

The Mixtral test is the issue's acceptance check, at three budgets in PowerInfer-2's 8-19 GB
range on the OnePlus 12: analytic pruning on 4 tokens, DES confirmation on 16 tokens.
"""

from __future__ import annotations

import pytest
from explore_helpers import PRESET, write_model

from sim.calibrate.apply import calibrated_config
from sim.calibrate.calibration import load_calibration
from sim.engine.config import RunConfig
from sim.engine.simulation import simulate
from sim.engine.strategies import get_strategy
from sim.explore.executors import make_executor
from sim.explore.planner import plan

SETTINGS = {"prune_tokens": 4, "warmup_tokens": 8, "confirm_tokens": 16, "passes": 1, "confirm": 1}


def test_plans_for_mixtral_are_at_least_as_fast_as_the_default_at_three_budgets():
    with make_executor(2) as ex:
        results = {b: plan("oneplus-12", "turbosparse-mixtral-47b", memory_budget=b, executor=ex, **SETTINGS)
                   for b in ("8GB", "13GB", "19GB")}
    for budget, res in results.items():
        assert res.best.tokens_per_s >= res.default.tokens_per_s, budget
        assert res.analytic_evaluations > 10 and res.des_evaluations >= 2
        assert tuple(res.resolved_knobs) == get_strategy(res.strategy).plan_knobs  # every searched knob, spelt out
        assert res.best.config.knobs == res.best.knobs and res.best.config.mode == "des"  # a candidate is a run
    # The reported figures are what an ordinary run with those knobs gives (checked at one budget).
    res = results["13GB"]  # its calibrated figures: sim run's (calibrated_config) with the plan's knobs
    run = {"memory_budget": "13GB", "decode_tokens": 16, "warmup_tokens": 8}
    cal = load_calibration(None)
    planned = simulate(calibrated_config(RunConfig.of(device="oneplus-12", model="turbosparse-mixtral-47b",
                                                      knobs=res.resolved_knobs, **run), cal))
    default = simulate(calibrated_config(RunConfig.of(device="oneplus-12", model="turbosparse-mixtral-47b", **run),
                                         cal))
    assert res.settings["calibration"] == cal.source
    assert planned.summary["decode_tokens_per_s"] == pytest.approx(res.best.tokens_per_s, rel=1e-9)
    assert default.summary["decode_tokens_per_s"] == pytest.approx(res.default.tokens_per_s, rel=1e-9)


def test_energy_objective_picks_the_least_energy_per_token_among_confirmed_plans(tmp_path):
    model = write_model(tmp_path)
    res = plan("oneplus-12", str(model), memory_budget="302MB", preset=PRESET, objective="energy",
               prune_tokens=2, warmup_tokens=2, confirm_tokens=4, passes=1, confirm=3)
    confirmed = [res.best, *res.runners_up]
    assert len(confirmed) == 4 and res.default in confirmed
    assert all(res.best.energy_j_per_token <= c.energy_j_per_token for c in confirmed)
    assert res.best.energy_j_per_token > 0
