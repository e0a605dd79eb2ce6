"""User-facing errors and outputs of `sim validate`, `sim cache compare`, `sim trace`, `sim memory`.

Bad input must fail in one line (``error: <file>: <field>: <message>``, status 2) before any
work runs; ``--json`` must be strict JSON (null, never a bare NaN); text tables must not show
``nan`` or call a figure kept for the record "failed".
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from cache_helpers import toy_trace

from sim import validation
from sim.cli import main
from sim.outputs import finite, json_text

FAST = "pi2-ts-mistral-inmem"  # a dense 7B run, about a second at two decode tokens
NOT_MODELLED = ["pi2-dram-bandwidth", "flash-opt-window-stats"]  # kept for the record, nothing runs


def _strict_json(text: str) -> object:
    """Parse as a strict JSON reader would: a bare NaN/Infinity is an error, not a float."""
    def refuse(token: str) -> object:
        raise AssertionError(f"not valid JSON: bare {token}")

    return json.loads(text, parse_constant=refuse)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any point, replay, fit or synthesis that starts fails the test: errors must come first."""
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("work started before the arguments were checked")

    import sim.cache.compare
    import sim.explore.planner
    import sim.traces.fit
    import sim.traces.synth

    monkeypatch.setattr(sim.explore.planner, "plan", forbidden)

    monkeypatch.setattr(validation, "run_point", forbidden)
    monkeypatch.setattr(sim.cache.compare, "compare_requests", forbidden)
    monkeypatch.setattr(sim.cache.compare, "compare_trace", forbidden)
    monkeypatch.setattr(sim.traces.fit, "fit_params", forbidden)
    monkeypatch.setattr(sim.traces.synth, "write_synthetic", forbidden)


@pytest.fixture
def requests_csv(tmp_path: Path) -> Path:
    """Seven keys of one byte each over 41 steps."""
    path = tmp_path / "r.csv"
    path.write_text("step,key\n" + "".join(f"{i},{i % 7}\n" for i in range(41)))
    return path


# 1. point ids


@pytest.mark.parametrize("ids", [["typo-id"], [FAST, "typo-id"]])
def test_unknown_point_id_is_named_with_the_valid_ids(no_runs, capsys, ids):
    assert main(["validate", *ids]) == 2
    err = _one_line_error(capsys)
    assert err.startswith(f"error: {validation.published_path()}: point id: unknown point id 'typo-id'")
    assert FAST in err.split("; ids: ", 1)[1]  # the valid ids are listed


def test_a_near_miss_id_suggests_the_close_ones(no_runs, capsys):
    assert main(["validate", "pi2-mixtral-miss-mea"]) == 2
    assert "did you mean pi2-mixtral-miss-mean" in _one_line_error(capsys)


def test_library_validate_refuses_unknown_ids_too(no_runs):
    with pytest.raises(validation.SimError, match="unknown point ids 'a', 'b'"):
        validation.validate(["a", FAST, "b"])


# 2. --decode-tokens, strict JSON, no "nan" in text


@pytest.mark.parametrize("tokens", ["0", "-3"])
def test_decode_tokens_below_one_fails_before_the_table(no_runs, capsys, tokens):
    assert main(["validate", "--decode-tokens", tokens]) == 2
    assert _one_line_error(capsys) == f"error: --decode-tokens: must be an integer >= 1, got {tokens}"


def test_json_has_null_not_nan_when_no_point_has_a_prediction(no_runs, capsys):
    assert main(["validate", *NOT_MODELLED, "--json"]) == 0
    data = _strict_json(capsys.readouterr().out)
    assert data["mape_pct"] is None
    assert [p["predicted"] for p in data["points"]] == [None, None]


def test_text_shows_a_dash_not_nan_percent(no_runs, capsys):
    assert main(["validate", *NOT_MODELLED]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "mean absolute percentage error: -" in out
    # the headline says why it has no figure: no point has a prediction (the bundled calibration has folds)
    assert "cross-validated MAPE - (none of the selected points has a prediction)" in out


def test_json_text_turns_every_non_finite_number_into_null():
    data = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": np.float64("nan"), "d": np.int64(3),
            "e": (np.float32(2.0), "x")}
    assert finite(data) == {"a": None, "b": [None, None, 1.5], "c": None, "d": 3, "e": [2.0, "x"]}
    assert _strict_json(json_text(data))["d"] == 3


# 3. output paths are checked before any work


def _unwritable(tmp_path: Path, name: str) -> str:
    """A path whose parent is a file: no writer can create it (works as root, unlike chmod)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    return str(blocker / name)


@pytest.mark.parametrize(("argv", "flag", "message"), [
    (["validate", "--out", "{bad}/v.csv"], "--out", "cannot write"),
    (["validate", "--out", "{tmp}/v.xlsx"], "--out", "unsupported extension '.xlsx'; allowed: .csv"),
    (["validate", "--plot", "{bad}/plots"], "--plot", "cannot write"),
    (["validate", "--plot", "{file}"], "--plot", "exists and is not a folder"),
    (["cache", "compare", "--requests", "{csv}", "--out", "{bad}/x.csv"], "--out", "cannot write"),
    (["cache", "compare", "--requests", "{csv}", "--out", "{tmp}/x.xlsx"], "--out",
     "unsupported extension '.xlsx'; allowed: .csv, .parquet"),
    (["cache", "compare", "--requests", "{csv}", "--plot", "{bad}/x.png"], "--plot", "cannot write"),
    (["cache", "compare", "--requests", "{csv}", "--plot", "{tmp}/x.jpg"], "--plot",
     "unsupported extension '.jpg'; allowed: .png, .pdf, .svg"),
    (["trace", "fit", "{trace}", "--out", "{bad}/fit.yaml"], "--out", "cannot write"),
    (["trace", "fit", "{trace}", "--out", "{tmp}/fit.json"], "--out", "allowed: .yaml, .yml"),
    (["trace", "synth", "--model", "llama-2-7b", "--tokens", "2", "--out", "{bad}/x.npz"], "--out", "cannot write"),
    (["trace", "synth", "--model", "llama-2-7b", "--tokens", "2", "--out", "{dir}"], "--out", "is a folder"),
    (["trace", "synth", "--model", "llama-2-7b", "--tokens", "2", "--out", "{tmp}/x.trace"], "--out",
     "allowed: .npz"),
    (["trace", "stats", "{trace}", "--plot", "{tmp}/s.gif"], "--plot", "allowed: .png, .pdf, .svg"),
    (["plan", "--memory-budget", "8GB", "--out", "{tmp}/plan.json"], "--out", "allowed: .yaml, .yml"),
    (["plan", "--memory-budget", "8GB", "--out", "{bad}/plan.yaml"], "--out", "cannot write"),
])
def test_bad_output_paths_fail_first_in_one_line(no_runs, tmp_path, requests_csv, capsys, argv, flag, message):
    trace = tmp_path / "t.npz"
    toy_trace(n_tokens=4).save(trace)
    existing = tmp_path / "existing.txt"
    existing.write_text("keep me")
    folder = tmp_path / "folder.npz"
    folder.mkdir()
    names = {"bad": _unwritable(tmp_path, "sub"), "tmp": str(tmp_path), "file": str(existing), "csv": str(requests_csv),
             "trace": str(trace), "dir": str(folder)}
    assert main([a.format(**names) for a in argv]) == 2
    err = _one_line_error(capsys)
    assert f": {flag}: " in err and message in err
    assert existing.read_text() == "keep me"  # the probe leaves an existing file alone


def test_trace_stats_plot_is_checked_before_the_statistics(tmp_path, capsys, monkeypatch):
    import sim.traces.stats

    monkeypatch.setattr(sim.traces.stats, "trace_stats", lambda *a, **k: pytest.fail("statistics computed"))
    assert main(["trace", "stats", str(tmp_path / "none.npz"), "--plot", _unwritable(tmp_path, "s.png")]) == 2
    assert "--plot: cannot write" in _one_line_error(capsys)


def test_cache_out_parquet_and_csv_write_what_they_say(tmp_path, requests_csv, capsys):
    import pandas as pd

    for name, read in (("rows.parquet", pd.read_parquet), ("rows.CSV", pd.read_csv)):
        out = tmp_path / name
        assert main(["cache", "compare", "--requests", str(requests_csv), "--policies", "lru", "--sizes", "2",
                     "--out", str(out)]) == 0
        assert read(out)["capacity_bytes"].tolist() == [2]
    capsys.readouterr()


# 4. cache sizes larger than every item


def test_cache_size_above_all_items_names_sizes_and_the_range(requests_csv, capsys, monkeypatch):
    import sim.cache.compare as compare

    monkeypatch.setattr(compare, "Replayer", lambda *a, **k: pytest.fail("replay started"))
    assert main(["cache", "compare", "--requests", str(requests_csv), "--sizes", "50%,1TB"]) == 2
    assert _one_line_error(capsys) == ("error: --sizes: must be in [1, 7] bytes (100% = all item bytes) or "
                                       "(0, 100]%, got '1TB' = 1,000,000,000,000 B")


def test_cache_size_of_all_items_is_allowed_and_shows_100_percent(requests_csv, capsys):
    assert main(["cache", "compare", "--requests", str(requests_csv), "--policies", "lru", "--sizes", "7",
                 "--json"]) == 0
    [row] = _strict_json(capsys.readouterr().out)
    assert row["capacity_pct"] == pytest.approx(100.0)


# 5. request CSV cells


@pytest.mark.parametrize(("cell", "shown"), [("1e30", "1e+30"), ("10.5", "10.5")])
def test_request_size_cells_give_a_clean_range_error(tmp_path, capsys, cell, shown):
    path = tmp_path / "reqs.csv"
    path.write_text(f"step,key,size\n0,1,{cell}\n1,2,3\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning on the way (an overflowing cast) is a defect too
        assert main(["cache", "compare", "--requests", str(path)]) == 2
    err = _one_line_error(capsys)
    assert str(path) in err and "size" in err and "row 1" in err
    assert f"must be an integer in [1, 2**40], got {shown}" in err


# 6. --context-tokens against the model's max_context


def test_memory_context_above_max_context_is_refused(capsys):
    assert main(["memory", "--model", "turbosparse-mistral-7b", "--context-tokens", "100000"]) == 2
    assert _one_line_error(capsys) == ("error: --context-tokens: must be at most the model's max_context 32768, "
                                       "got 100000")


def test_memory_context_at_max_context_is_planned_as_strict_json(capsys):
    assert main(["memory", "--model", "turbosparse-mistral-7b", "--context-tokens", "32768", "--json"]) == 0
    plan = _strict_json(capsys.readouterr().out)
    assert plan["context_tokens"] == 32768


def test_memory_set_edits_a_profile_field_and_refuses_knobs(capsys):
    assert main(["memory", "--json"]) == 0
    before = _strict_json(capsys.readouterr().out)
    sets = ["--set", "model.predictor.rank=512", "--set", "device.dram.usable_bytes=12GB"]
    assert main(["memory", "--json", *sets]) == 0
    after = _strict_json(capsys.readouterr().out)
    assert after["overrides"] == {"model.predictor.rank": 512, "device.dram.usable_bytes": "12GB"}
    assert after["budget_bytes"] == 12_000_000_000 and before["budget_bytes"] > after["budget_bytes"]
    assert after["resident"]["predictors"] > before["resident"]["predictors"]
    assert main(["memory", "--set", "cluster_neurons=64"]) == 2
    assert _one_line_error(capsys).startswith("error: --set cluster_neurons: this command takes profile fields only")


def test_a_renamed_model_keeps_its_own_activations(capsys):
    """--set model.name relabels; it must not pick the trace preset of whatever the new name is.
    (Uncalibrated: a calibrated preset value replaces the preset by its edited trace.)"""
    assert main(["run", "--decode-tokens", "4", "--json", "--calibration", "none"]) == 0
    base = _strict_json(capsys.readouterr().out)
    assert main(["run", "--decode-tokens", "4", "--json", "--calibration", "none",
                 "--set", "model.name=my-mixtral"]) == 0
    renamed = _strict_json(capsys.readouterr().out)
    assert renamed["model"] == "my-mixtral" and renamed["config"]["preset"] == "turbosparse-mixtral-47b"
    assert renamed["decode_tokens_per_s"] == base["decode_tokens_per_s"]
    assert renamed["config"]["base_profiles"] == {"device": "oneplus-12", "model": "turbosparse-mixtral-47b"}
    # a bundled profile's name would print that phone over the OnePlus 12's figures
    assert main(["run", "--decode-tokens", "4", "--set", "device.name=pixel-8-pro"]) == 2
    assert "'pixel-8-pro' is another bundled device" in _one_line_error(capsys)


# 7. not-modelled rows are not "failed"


def test_not_modelled_rows_say_so_and_keep_their_json_keys(no_runs, capsys):
    assert main(["validate", *NOT_MODELLED]) == 0
    out = capsys.readouterr().out
    assert out.count("not modelled") >= 2 and "failed" not in out
    assert main(["validate", *NOT_MODELLED, "--json"]) == 0
    rows = _strict_json(capsys.readouterr().out)["points"]
    assert {"id", "source", "device", "model", "strategy", "setting", "metric", "published", "predicted",
            "error_pct", "within_tolerance", "tolerance_pct", "required", "modelled", "error"} <= set(rows[0])
    assert [(r["status"], r["modelled"]) for r in rows] == [("not modelled", False)] * 2
    assert all(r["error"].startswith("not modelled: ") for r in rows)


def test_a_failed_point_still_says_failed_and_exits_2(monkeypatch, capsys):
    good = next(p for p in validation.load_points() if p["id"] == FAST)
    monkeypatch.setattr(validation, "load_points", lambda: [{**good, "id": "broken", "model": "no-such-model"}])
    assert main(["validate", "--decode-tokens", "2", "--json"]) == 2
    captured = capsys.readouterr()
    [row] = _strict_json(captured.out)["points"]
    assert row["status"] == "failed" and "no-such-model" in row["error"]
    assert captured.err == "error: 1 point(s) could not run: broken (the table gives each error)\n"


def test_a_run_that_gives_nan_is_a_failure_not_nan_percent(monkeypatch, capsys):
    good = next(p for p in validation.load_points() if p["id"] == FAST)
    monkeypatch.setattr(validation, "load_points", lambda: [good])
    monkeypatch.setattr(validation, "metric_value", lambda summary, metric: math.nan)
    assert main(["validate", "--decode-tokens", "2"]) == 2
    out = capsys.readouterr().out
    assert "failed" in out and "nan%" not in out.lower()


# --json of the profile commands goes through the same strict writer


def test_profiles_json_is_strict_and_ends_with_a_newline(capsys):
    assert main(["profiles", "list", "--json"]) == 0
    names = {r["name"] for r in _strict_json(capsys.readouterr().out)}
    assert "turbosparse-mistral-7b" in names
    assert main(["profiles", "show", "turbosparse-mistral-7b", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("}\n") and _strict_json(out)["max_context"] == 32768


def test_ctrl_c_inside_a_compiled_kernel_is_an_interruption_not_a_traceback(monkeypatch, capsys):
    """Ctrl-C while a numba kernel runs surfaces as a SystemError caused by KeyboardInterrupt;
    the CLI must report it as an interruption (exit 130), as for Ctrl-C anywhere else."""
    from sim.engine import simulation

    def interrupted(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as signal_exc:
            raise SystemError("CPUDispatcher(<function neuron_chunk>) returned a result with an exception "
                              "set") from signal_exc

    monkeypatch.setattr(simulation, "simulate", interrupted)
    assert main(["run", "--decode-tokens", "2"]) == 130
    assert capsys.readouterr().err == "error: interrupted\n"

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(simulation, "simulate", ctrl_c)  # typer turns this one into Exit(130) itself
    assert main(["run", "--decode-tokens", "2"]) == 130
    assert capsys.readouterr().err == "error: interrupted\n"
    monkeypatch.setattr(simulation, "simulate", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # a real bug still shows its traceback
        main(["run", "--decode-tokens", "2"])


@pytest.mark.parametrize(("flag", "value", "allowed"), [("--split", "foo", "shared, per-layer"),
                                                       ("--granularity", "foo", "neuron, cluster")])
def test_cache_compare_names_its_own_flag_for_a_bad_choice(no_runs, tmp_path, capsys, flag, value, allowed):
    trace = tmp_path / "t.npz"
    toy_trace(n_tokens=4).save(trace)
    assert main(["cache", "compare", "--trace", str(trace), "--sizes", "10%", flag, value]) == 2
    assert _one_line_error(capsys) == f"error: {flag}: must be one of {allowed}; got '{value}'"


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--set", "cluster_neurons=99999999999999999999"], "--set cluster_neurons: must be <= 1048576"),
    (["run", "--strategy", "llm-in-flash", "--set", "window_k=99999999999999999999"], "--set window_k: must be <="),
    (["run", "--seed", "99999999999999999999999999"], "--seed: must be an integer in [0, 2**63 - 1]"),
    (["run", "--warmup-tokens", "99999999999"], "--warmup-tokens: must be an integer in [0, 1000000]"),
    (["run", "--profile-tokens", "99999999999"], "--profile-tokens: must be an integer in [0, 1000000]"),
    (["trace", "record", "--model", "tiny", "--text", "{text}", "--tokens", "2", "--out", "{tmp}/r.npz",
      "--seed", "-1"], "--seed: must be an integer in [0, 2**63 - 1]"),
])
def test_integers_beyond_what_the_engine_holds_are_refused_in_one_line(tmp_path, capsys, argv, message):
    """A knob or seed too large for 64 bits crashed the compiled kernels or, in a sweep, the
    results writer after the points had run (their rows lost)."""
    text = tmp_path / "t.txt"
    text.write_text("hello")
    assert main([a.format(text=text, tmp=tmp_path) for a in argv]) == 2
    assert message in _one_line_error(capsys)


def test_an_unknown_policy_is_offered_only_policies_a_run_can_take(capsys):
    assert main(["run", "--policy", "nope"]) == 2
    err = _one_line_error(capsys)
    assert "unknown policy 'nope'; choose one of lru," in err and "belady" not in err  # belady needs the future


def test_an_unknown_field_lists_the_fields_allowed_where_it_sits(tmp_path, capsys):
    from sim.profiles.registry import resolve_path

    typo = tmp_path / "phone.yaml"
    typo.write_text(resolve_path("device", "oneplus-12").read_text().replace("  usable_bytes:", "  usable_byte:"))
    assert main(["run", "--device", str(typo), "--decode-tokens", "2"]) == 2
    assert "dram.usable_byte: unknown field (typo?); allowed here: type, total_bytes, usable_bytes, peak_gbps" \
        in _one_line_error(capsys)


def test_a_bad_value_in_a_union_field_is_named_by_the_field_not_the_union_member(tmp_path, capsys):
    """pydantic adds the union member it tried (``.float``) to the location: no field of the spec."""
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {model: turbosparse-mistral-7b, decode_tokens: 4, memory_budget: 3GB}\n"
                    "sample: {n: 2, ranges: {knobs.hot_share: {low: 0, high: .inf}}}\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "r.parquet"), "--dry-run"]) == 2
    err = _one_line_error(capsys)
    assert ": sample.ranges.knobs.hot_share.high: " in err and ".float" not in err


def test_options_that_change_nothing_say_so(tmp_path, capsys):
    """--seed with --trace, and a trace or seed with the dense strategy, gave identical figures
    without a word: a user sweeping seeds would believe the spread was measured."""
    trace = tmp_path / "t.npz"
    assert main(["trace", "synth", "--model", "turbosparse-mistral-7b", "--tokens", "24", "--out", str(trace)]) == 0
    capsys.readouterr()
    run = ["run", "--model", "turbosparse-mistral-7b", "--memory-budget", "3GB", "--decode-tokens", "4", "--json"]
    figures = []
    for seed in ("0", "5"):
        assert main([*run, "--trace", str(trace), "--profile-tokens", "4", "--seed", seed]) == 0
        out = _strict_json(capsys.readouterr().out)
        figures.append(out["decode_tokens_per_s"])
        assert any("changes nothing with --trace" in w for w in out["warnings"]) == (seed == "5")
    assert figures[0] == figures[1]
    dense = ["run", "--model", "turbosparse-mistral-7b", "--strategy", "dense", "--decode-tokens", "4", "--json"]
    assert main([*dense, "--seed", "3"]) == 0
    assert any("dense strategy computes every weight" in w for w in _strict_json(capsys.readouterr().out)["warnings"])
    assert main(dense) == 0
    assert not _strict_json(capsys.readouterr().out)["warnings"]


def test_a_calibrated_runs_seed_draws_its_trace_and_is_not_said_to_change_nothing(capsys):
    """A calibrated run replays a trace generated from its edited preset with its own seed: the
    seed changes the activations (and the figures), so the --trace warning does not apply."""
    run = ["run", "--model", "turbosparse-mistral-7b", "--memory-budget", "3GB", "--decode-tokens", "4", "--json"]
    out = {}
    for seed in ("0", "5"):
        assert main([*run, "--seed", seed]) == 0
        out[seed] = _strict_json(capsys.readouterr().out)
        assert out[seed]["calibration"] != "none"
        assert not any("changes nothing" in w for w in out[seed]["warnings"])
    assert out["0"]["decode_tokens_per_s"] != out["5"]["decode_tokens_per_s"]
