"""sim/engine/steady_state.py and sim/engine/run_length.py: warm-up, interval, ``--decode-tokens auto``."""

from __future__ import annotations

import json

import engine_helpers as h
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.engine.config import DEFAULT_DECODE_TOKENS
from sim.engine.run_length import (
    AUTO_HALF_WIDTH,
    AUTO_MAX_REPLICATIONS,
    AUTO_MIN_REPLICATIONS,
    parse_decode_tokens,
    replication_interval,
    replication_seed,
    replications_needed,
)
from sim.engine.steady_state import batch_means_ci, mser5_warmup, steady_state
from sim.errors import SimError


@settings(max_examples=30, deadline=None)
@given(warm=st.integers(2, 12), seed=st.integers(0, 10_000))
def test_mser5_deletes_a_transient_and_little_else(warm, seed):
    rng = np.random.default_rng(seed)
    steady = 0.25 + 0.01 * rng.standard_normal(300)
    transient = np.full(5 * warm, 0.15)  # fast first tokens (a cache fitted to them), far off the steady state
    x = np.r_[transient, steady]
    d = mser5_warmup(x)
    # the whole transient goes; what else goes is noise MSER judged cheaper to drop (never over half)
    assert 5 * warm <= d <= len(x) // 2
    assert x[d:].mean() == pytest.approx(0.25, rel=0.01)


def test_mser5_keeps_a_stationary_run_nearly_whole():
    rng = np.random.default_rng(1)
    assert mser5_warmup(0.2 + 0.01 * rng.standard_normal(400)) < 200  # searched over the first half only
    assert mser5_warmup(np.ones(12)) == 0  # too short to judge


def test_the_batch_means_interval_covers_the_mean_about_95_percent_of_the_time():
    # an autocorrelated (AR(1)) series: the tokens are not independent, the batches nearly are
    rng = np.random.default_rng(7)
    hits = 0
    reps = 300
    for _ in range(reps):
        e = rng.standard_normal(600)
        x = np.empty(600)
        x[0] = e[0]
        for i in range(1, 600):
            x[i] = 0.5 * x[i - 1] + e[i]
        _, lo, hi, k = batch_means_ci(1.0 + 0.05 * x)
        hits += lo <= 1.0 <= hi
        assert k == 20
    assert 0.88 <= hits / reps <= 0.99


def test_more_tokens_tighten_the_interval_and_tokens_per_s_is_one_over_the_mean_latency():
    rng = np.random.default_rng(3)
    short, long = (steady_state(0.25 + 0.02 * rng.standard_normal(n)) for n in (100, 1600))
    assert long.half_width < short.half_width / 2
    lo, hi = long.ci
    assert lo < long.decode_tokens_per_s < hi and long.decode_tokens_per_s == pytest.approx(4.0, rel=0.01)
    assert steady_state(np.full(5, 0.1)).ci is None  # too few tokens: no interval, not a fake one


def test_replications_grow_towards_the_target():
    tight = [4.0, 4.01, 3.99]
    assert replications_needed(tight) == 4  # at least one more
    mean, lo, hi = replication_interval(tight)
    assert lo < mean < hi and (hi - lo) / 2 / mean < AUTO_HALF_WIDTH
    assert replications_needed([4.0, 4.4, 3.6]) > 10  # a 10% spread needs many
    assert parse_decode_tokens("auto") == "auto" and parse_decode_tokens("64") == 64
    for bad in ("0", "-3", "lots", "1.5"):
        with pytest.raises(SimError, match="positive integer or auto"):
            parse_decode_tokens(bad)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), other=st.integers(0, 2**63 - 1))
def test_replications_start_at_the_runs_seed_and_two_seeds_share_none(seed, other):
    mine = [replication_seed(seed, i) for i in range(AUTO_MAX_REPLICATIONS)]
    assert mine[0] == seed and mine == [replication_seed(seed, i) for i in range(AUTO_MAX_REPLICATIONS)]
    assert all(0 <= s <= 2**63 - 1 for s in mine) and len(set(mine)) == len(mine)
    if other != seed:  # seeds 0-4 of an auto run are independent estimates, not one estimate shifted
        theirs = {replication_seed(other, i) for i in range(1, AUTO_MAX_REPLICATIONS)}
        assert not theirs & set(mine[1:])


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("steady")
    model = h.write_yaml(folder / "tiny-moe.yaml", h.TINY_MOE)
    return {"model": str(model), "preset": "tiny-moe-test"}


def _run(files: dict[str, str], *extra: str) -> list[str]:
    return ["run", "--model", files["model"], "--prompt-tokens", "8", "--warmup-tokens", "4", "--offload", "0.5",
            *extra]


def test_a_run_reports_its_interval_and_auto_runs_until_it_is_tight(long_trace, capsys):
    assert main([*_run(long_trace, "--decode-tokens", "64"), "--json"]) == 0
    fixed = json.loads(capsys.readouterr().out)
    lo, hi = fixed["decode_tokens_per_s_ci"]
    assert lo < fixed["steady_state"]["decode_tokens_per_s"] < hi
    assert main([*_run(long_trace, "--decode-tokens", "auto"), "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    record = auto["decode_tokens_auto"]
    n = record["replications"]
    assert AUTO_MIN_REPLICATIONS <= n <= AUTO_MAX_REPLICATIONS
    assert record["seeds"] == [replication_seed(0, i) for i in range(n)]
    assert auto["config"]["decode_tokens"] == DEFAULT_DECODE_TOKENS  # the stated length, replicated
    mean, lo, hi = replication_interval(record["figures"])
    assert auto["decode_tokens_per_s_ci"] == pytest.approx([lo, hi])
    if record["met"]:
        assert (hi - lo) / 2 / mean <= AUTO_HALF_WIDTH
    else:  # stopped at the cap: said so
        assert n == AUTO_MAX_REPLICATIONS and any("cap" in w for w in auto["warnings"])
    assert main(_run(long_trace, "--decode-tokens", "auto")) == 0
    text = capsys.readouterr().out
    assert "steady state, 95% CI" in text and "decode tokens: 128 (auto:" in text and "replications" in text


def test_a_bad_count_is_one_line_and_exit_2(long_trace, capsys):
    assert main(_run(long_trace, "--decode-tokens", "many")) == 2
    err = capsys.readouterr().err
    assert "--decode-tokens" in err and "positive integer or auto" in err and "Traceback" not in err
