"""sim/explore/uncertainty.py and `sim run --uncertainty`: a phone no published point covers is less certain."""

from __future__ import annotations

import json

import pytest

from sim.calibrate.calibration import load_calibration
from sim.cli import main
from sim.engine.config import RunConfig
from sim.explore.uncertainty import draws, sampled_unknowns

RUN = ["run", "--model", "turbosparse-mistral-7b", "--offload", "0.5", "--decode-tokens", "16",
       "--uncertainty", "--samples", "8", "--json"]


def _interval(capsys, device: str) -> dict:
    assert main([*RUN, "--device", device]) == 0
    out = json.loads(capsys.readouterr().out)
    return out["decode_tokens_per_s_interval"]


def test_a_phone_without_a_published_point_gets_a_wider_interval_than_the_oneplus_12(capsys):
    known, unknown = _interval(capsys, "oneplus-12"), _interval(capsys, "pixel-8-pro")
    assert set(known["unknowns"].values()) == {"calibration"} and set(unknown["unknowns"].values()) == {"prior"}
    for i in (known, unknown):
        assert i["lo"] <= i["median"] <= i["hi"] and i["samples"] == 8 and i["level"] == 0.9
    width = {name: (i["hi"] - i["lo"]) / i["median"] for name, i in (("known", known), ("unknown", unknown))}
    assert width["unknown"] > width["known"] > 0


def test_draws_stay_in_the_prior_and_a_users_value_is_not_sampled():
    cal = load_calibration(None)
    config = RunConfig(model="turbosparse-mixtral-47b", memory_budget="12GB")
    reach = sampled_unknowns(config, cal)
    assert {u.name for u in reach} >= {"mixtral-persistence", "pi2-sparse-gemv-speed"}
    for values in draws(reach, cal, 16, seed=3):
        for u, v in values.items():
            assert u.prior[0] <= v <= u.prior[1]
    mine = sampled_unknowns(config, cal, user_paths=("model.predictor.rank",))
    assert "mixtral-predictor-rank" not in {u.name for u in mine}


def test_uncertainty_needs_a_calibration(capsys):
    assert main([*RUN, "--calibration", "none"]) == 2
    assert "--uncertainty" in capsys.readouterr().err


@pytest.mark.parametrize("samples", ["1", "0"])
def test_too_few_samples_is_one_line(capsys, samples):
    assert main([*RUN[:-3], "--samples", samples]) == 2
    assert "--samples" in capsys.readouterr().err
