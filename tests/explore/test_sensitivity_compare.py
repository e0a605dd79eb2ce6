"""`sim sensitivity` (Morris screening, stable across sampler seeds) and `sim compare` (one table)."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.engine.reevaluate import splits
from sim.explore.sensitivity import (
    LEVELS,
    SPLIT_TRAJECTORIES,
    WHOLE_TRAJECTORIES,
    default_trajectories,
    evaluation_order,
)

SMALL = ["--model", "turbosparse-mistral-7b", "--offload", "0.5", "--decode-tokens", "16"]


def _rows(capsys, seed: int) -> list[dict]:
    assert main(["sensitivity", *SMALL, "--trajectories", "4", "--sampler-seed", str(seed), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _ranking(capsys, seed: int, rows: list[dict] | None = None) -> list[str]:
    rows = _rows(capsys, seed) if rows is None else rows
    assert [r["mu_star"] for r in rows] == sorted((r["mu_star"] for r in rows), reverse=True)
    for r, nxt in itertools.pairwise(rows):  # tied: the two mu* intervals overlap
        assert r["tied_with_next"] == (r["mu_star"] - r["mu_star_conf"] <= nxt["mu_star"] + nxt["mu_star_conf"])
    assert rows[-1]["tied_with_next"] is False
    return [r["input"] for r in rows]


def test_the_top_three_are_the_same_for_two_sampler_seeds(capsys, tmp_path):
    """Up to ties: each seed's first input has a mu* interval that overlaps the other seed's first,
    and an input in one seed's top three and not the other's has one that overlaps the other
    seed's third (the ranking says the two cannot be told apart)."""
    rows_a, rows_b = _rows(capsys, 0), _rows(capsys, 1)
    a, b = _ranking(capsys, 0, rows_a), _ranking(capsys, 1, rows_b)
    for mine, other in ((rows_a, rows_b), (rows_b, rows_a)):
        first, there = other[0], next(x for x in other if x["input"] == mine[0]["input"])
        assert there["mu_star"] + there["mu_star_conf"] >= first["mu_star"] - first["mu_star_conf"], a[:2] + b[:2]
        top = {r["input"] for r in other[:3]}
        third = other[2]
        for r in mine[:3]:
            if r["input"] not in top:
                there = next(x for x in other if x["input"] == r["input"])
                assert there["mu_star"] + there["mu_star_conf"] >= third["mu_star"] - third["mu_star_conf"], r["input"]
    assert "pi2-sparse-gemv-speed" in a and "flash curves" in a  # calibrated unknowns and profile fields
    plot = tmp_path / "mu.png"
    assert main(["sensitivity", *SMALL, "--trajectories", "2", "--params", "CPU*,flash*", "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:4] == b"\x89PNG" and "wrote" in capsys.readouterr().out


def test_a_selection_that_matches_nothing_is_one_line(capsys):
    assert main(["sensitivity", *SMALL, "--params", "nonesuch"]) == 2
    assert "--params" in capsys.readouterr().err


def test_compare_puts_two_phones_in_one_table_with_intervals_and_bottlenecks(capsys):
    assert main(["compare", "--devices", "oneplus-12,pixel-8-pro", *SMALL, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["device"] for r in rows] == ["oneplus-12", "pixel-8-pro"]
    for r in rows:
        lo, hi = r["decode_tokens_per_s_ci"]
        assert lo <= hi and r["decode_tokens_per_s"] > 0 and r["bottleneck"]
    assert main(["compare", "--devices", "oneplus-12,pixel-8-pro", *SMALL]) == 0
    text = capsys.readouterr().out
    assert "95% CI" in text and "bottleneck" in text and "pixel-8-pro" in text
    assert main(["compare", *SMALL]) == 2  # nothing to compare


@pytest.mark.parametrize(("argv", "error"), [
    (["--strategies", "powerinfer2"], "error: --strategies: give at least two of something to compare, e.g. "
                                      "--devices oneplus-12,pixel-8-pro; --strategies names one"),
    (["--strategies", "foo,powerinfer2"], "error: --strategies: unknown strategy 'foo'; choose one of "),
    (["--devices", "oneplus-12,nosuch"], "error: --devices: unknown device 'nosuch'; "),
])
def test_a_bad_list_names_the_list_flag(capsys, argv, error):
    """sim compare's errors name its own flags (--strategies), not sim run's (--strategy)."""
    assert main(["compare", *argv, *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith(error) and err.count("\n") == 1, err


@settings(max_examples=50, deadline=None)
@given(kinds=st.lists(st.sampled_from(["preset", "model", "knobs", "device", "profile field"]), min_size=1,
                      max_size=6),
       rows=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_the_evaluation_order_groups_the_rows_that_share_the_dearest_inputs(kinds, rows, seed):
    """Every row once, and the rows that share every trace-preset and model value run together, so
    each trace is made once whatever the number of trajectories."""
    items = [(f"x{i}", f"device.k{i}:scale" if k == "profile field" else SimpleNamespace(kind=k))
             for i, k in enumerate(kinds)]
    x = np.random.default_rng(seed).integers(0, LEVELS, (rows, len(items))) / (LEVELS - 1)
    order = evaluation_order(x, items)
    assert sorted(order.tolist()) == list(range(rows))
    dear = [i for i, k in enumerate(kinds) if k in ("preset", "model")]
    if dear:
        keys = [tuple(x[j, dear]) for j in order]
        runs = [k for n, k in enumerate(keys) if n == 0 or k != keys[n - 1]]
        assert len(runs) == len(set(keys))  # each combination in one contiguous run


def test_the_default_trajectories_follow_what_an_evaluation_costs():
    """A thousand where a device edit re-prices kept plans (the default run: its top three are within
    5% of each other), the old eight where every evaluation is a whole analytic run."""
    assert splits("powerinfer2") and not any(splits(s) for s in ("llm-in-flash", "llamacpp", "dense"))
    assert default_trajectories(SimpleNamespace(strategy="powerinfer2")) == SPLIT_TRAJECTORIES == 1000
    assert default_trajectories(SimpleNamespace(strategy="llm-in-flash")) == WHOLE_TRAJECTORIES


def test_compare_quotes_the_prediction_interval_sim_run_prints(capsys):
    """One configuration, one interval: compare samples as many draws as sim run by default."""
    assert main(["run", *SMALL, "--uncertainty", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert main(["compare", "--devices", "oneplus-12,pixel-8-pro", *SMALL, "--uncertainty", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["device"] == "oneplus-12"
    assert row["decode_tokens_per_s"] == run["decode_tokens_per_s"]
    assert row["decode_tokens_per_s_interval"] == run["decode_tokens_per_s_interval"]
