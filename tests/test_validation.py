"""sim/validation.py and `sim validate`: every published point runs, reports, and plots.

Only fast points are run here (a dense 7B model in memory, and the bundled OPT-6.7B
point with two decode tokens); the full table is what ``sim validate`` prints.
"""

from __future__ import annotations

import json

import pytest

from sim import validation
from sim.cli import main
from sim.engine.strategies import get_strategy
from sim.profiles.memory import plan_memory
from sim.profiles.registry import load_device, load_model

FAST = "pi2-ts-mistral-inmem"


def test_every_point_names_its_source_and_a_runnable_setting():
    points = validation.load_points()
    assert len({p["id"] for p in points}) == len(points)
    for p in points:
        assert p["source"].startswith("["), p["id"]
        assert p["published"] > 0 and p["metric"]
        if p.get("modelled") is False:  # kept for the record: must say why no run reproduces it
            assert len(p["why"]) > 20, p["id"]
            assert "known_gap" not in p, p["id"]  # no prediction, so nothing to be off
            continue
        gap = p.get("known_gap")  # why a prediction is known to be off, printed under `sim validate`'s table
        assert gap is None or (isinstance(gap, str) and len(gap) > 20), p["id"]
        load_device(p["device"]), load_model(p["model"]), get_strategy(p["strategy"])
        assert ("memory_budget" in p) != ("offload" in p), p["id"]


def test_offload_points_sit_at_the_budget_that_offloads_that_share():
    frame = validation.published_frame(metric=None)
    points = {p["id"]: p for p in validation.load_points()}
    for row in frame.itertuples(index=False):
        p = points[row.id]
        if "offload" not in p:
            continue
        strat = get_strategy(p["strategy"])
        plan = plan_memory(load_model(p["model"]), load_device(p["device"]), budget=int(row.budget_bytes),
                           weights_dtype=p.get("weights_dtype"), context_tokens=128,
                           predictor=strat.uses_predictor, split_scales=strat.split_scales)
        assert plan.offload_fraction == pytest.approx(p["offload"], abs=1e-6), row.id


def test_published_frame_filters():
    frame = validation.published_frame(model="turbosparse-mixtral-47b", device="oneplus-12")
    assert set(frame["metric"]) == {"decode_tokens_per_s"} and set(frame["model"]) == {"turbosparse-mixtral-47b"}
    assert len(frame) >= 2 and frame["budget_bytes"].gt(0).all()


def test_validate_json_keys_and_plots(tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["validate", FAST, "--decode-tokens", "2", "--json", "--plot", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    [row] = data["points"]
    assert {"id", "source", "device", "model", "strategy", "setting", "metric", "published", "predicted",
            "error_pct", "within_tolerance", "tolerance_pct", "required", "known_gap"} <= set(row)
    note = next(p for p in validation.load_points() if p["id"] == FAST).get("known_gap")
    assert row["known_gap"] == note  # the point's note, as published.yaml has it (or none)
    assert row["id"] == FAST and data["mape_pct"] == pytest.approx(abs(row["error_pct"]))
    assert row["error_pct"] == pytest.approx(100 * (row["predicted"] - row["published"]) / row["published"])
    assert sorted(p.name for p in out.iterdir()) == ["published_vs_predicted.png", "validation_errors.png"]


def test_table_names_device_and_sources(capsys):
    assert main(["validate", FAST, "--decode-tokens", "2"]) == 0
    text = capsys.readouterr().out
    assert "oneplus-12" in text and "mean absolute percentage error" in text and "[BLOG]: MAPE" in text


def test_a_point_that_cannot_run_is_reported_and_exits_2(monkeypatch, capsys):
    good = next(p for p in validation.load_points() if p["id"] == FAST)
    bad = {**good, "id": "broken", "model": "no-such-model"}
    monkeypatch.setattr(validation, "load_points", lambda: [good, bad])
    assert main(["validate", "--decode-tokens", "2"]) == 2
    text = capsys.readouterr().out
    assert "failed" in text and "no-such-model" in text


def test_ladder_points_run_the_knobs_of_their_rung_as_sim_ablate_does():
    """[FLASH] Table 2's points name their rungs; these are the knobs they used to spell out."""
    points = {p["id"]: p for p in validation.load_points()}
    naive = {"hybrid": False, "predictor": False, "window_k": 0, "bundling": False}
    assert points["flash-opt-io-naive"]["knobs"] == naive == points["flash-opt-total-naive"]["knobs"]
    assert points["flash-opt-io-hybrid"]["knobs"] == {"predictor": False, "window_k": 0, "bundling": False}
    assert points["flash-opt-io-predictor"]["knobs"] == {"window_k": 0, "bundling": False}
    # Apple's program keeps a 5-token window ([FLASH] §4.1); the strategy's default fills the budget
    assert points["flash-opt-io-window"]["knobs"] == {"bundling": False, "window_k": 5}
    assert points["flash-opt-io-bundling"]["knobs"] == {"window_k": 5}
    assert points["pi2-bamboo-ablation-cache-hit"]["knobs"] == {"pipeline": False, "xpu": False}


@pytest.mark.parametrize(("extra", "message"), [
    ({"rung": "cache"}, "unknown rung 'cache'; the ladder's rungs: baseline, bundle, neuron_cache, pipeline, xpu"),
    ({"rung": "bundle", "knobs": {"xpu": True}}, "knob xpu is the rung's to set"),
    ({"rung": "bundle", "ladder": ["bundle", "warp"]}, "unknown mechanism 'warp'"),
])
def test_a_bad_rung_names_the_point(monkeypatch, extra, message):
    point = {"id": "p", "source": "[X]", "strategy": "powerinfer2", **extra}
    monkeypatch.setattr(validation, "load_yaml_text", lambda text, name: {"points": [point]})
    with pytest.raises(validation.SimError, match=message) as err:
        validation.load_points()
    assert err.value.source == "published.yaml" and err.value.field == "p.rung"


def test_a_point_run_analytic_gives_what_the_des_gives_for_its_metric():
    """A point may name `mode: analytic` where its metric does not depend on timing (a cache's
    hit ratio: the trace's replay through the cache decides it); the DES must agree with it."""
    analytic = [p for p in validation.load_points() if p.get("mode") == "analytic"]
    assert analytic, "no published point runs analytic"
    for point in analytic:
        assert point["metric"].startswith("cache_"), point["id"]
        got = validation.run_point(point, decode_tokens=8)["predicted"]
        des = validation.run_point({**point, "mode": "des"}, decode_tokens=8)["predicted"]
        assert got == pytest.approx(des, rel=1e-9), point["id"]


def test_a_points_profile_overrides_reach_its_run_and_not_the_baseline_it_names():
    """[PI2] Table 4's I/O shares compare a run whose reads cost nothing (the point's `overrides`)
    with the real run (its `baseline`, `overrides: {}`): the ratio is over 1 only if the overrides
    reach the point's run and stay out of the baseline's, and it is 1 when both runs get them."""
    point = next(p for p in validation.load_points() if p["id"] == "flash-bamboo-io-share")
    assert point["overrides"] and point["baseline"]["overrides"] == {}
    share = validation.run_point(point, decode_tokens=4, warmup_tokens=0)["predicted"]
    both_free = {**point, "baseline": {**point["baseline"], "overrides": point["overrides"]}}
    same = validation.run_point(both_free, decode_tokens=4, warmup_tokens=0)["predicted"]
    assert share > 2.0  # the port's offloaded token is mostly waiting on flash
    assert same == pytest.approx(1.0, rel=1e-9)
