"""`sim sensitivity` (Morris screening, stable across sampler seeds) and `sim compare` (one table)."""

from __future__ import annotations

import json

from sim.cli import main

SMALL = ["--model", "turbosparse-mistral-7b", "--offload", "0.5", "--decode-tokens", "16"]


def _ranking(capsys, seed: int) -> list[str]:
    assert main(["sensitivity", *SMALL, "--trajectories", "4", "--sampler-seed", str(seed), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["mu_star"] for r in rows] == sorted((r["mu_star"] for r in rows), reverse=True)
    return [r["input"] for r in rows]


def test_the_top_three_are_the_same_for_two_sampler_seeds(capsys, tmp_path):
    a, b = _ranking(capsys, 0), _ranking(capsys, 1)
    assert a[:3] == b[:3]
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
