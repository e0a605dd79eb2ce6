"""`sim sweep` (run, resume, plot, heatmap) and `sim plan` on a tiny model, through the CLI."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from explore_helpers import PRESET, base, write_model, write_spec

from sim.cli import main
from sim.explore.store import read_results

PNG = b"\x89PNG"


@pytest.fixture()
def spec(tmp_path):
    return write_spec(tmp_path, {"name": "cli", "base": base(),
                                 "grid": {"memory_budget": ["301.6MB", "302MB", "303MB"],
                                          "strategy": ["powerinfer2", "llm-in-flash"]},
                                 "seeds": [0, 1]})


def test_sweep_runs_resumes_and_plots(spec, tmp_path, capsys):
    out = tmp_path / "r.parquet"
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 0
    assert "12 points, 0 already done, 12 run, 0 failed" in capsys.readouterr().out
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress", "--workers", "2"]) == 0
    assert "12 already done, 0 run" in capsys.readouterr().out
    assert main(["sweep", str(spec), "--out", str(out), "--dry-run"]) == 0
    assert "12 already in" in capsys.readouterr().out
    df = read_results(out)
    assert len(df) == 12 and df["point_id"].is_unique
    line, heat = tmp_path / "line.png", tmp_path / "heat.png"
    assert main(["sweep", "plot", str(out), "--x", "memory_budget", "--y", "decode_tokens_per_s", "--hue",
                 "strategy", "--out", str(line)]) == 0
    assert main(["sweep", "heatmap", str(out), "--x", "memory_budget", "--y", "strategy", "--out", str(heat)]) == 0
    assert line.read_bytes()[:4] == PNG and heat.read_bytes()[:4] == PNG
    assert "averaged together" not in capsys.readouterr().err  # seeds are meant to be averaged


def test_a_file_holding_two_sweeps_says_so_when_run_and_when_plotted(spec, tmp_path, capsys):
    """Rows of an earlier spec stay in the file (resume relies on it), but a plot that would
    average two token counts into one line must not do it silently."""
    out = tmp_path / "r.parquet"
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 0
    longer = yaml.safe_load(spec.read_text())
    longer["base"]["decode_tokens"] = 6
    other = tmp_path / "longer.yaml"
    other.write_text(yaml.safe_dump(longer))
    capsys.readouterr()
    assert main(["sweep", str(other), "--out", str(out), "--no-progress"]) == 0
    assert "note: r.parquet also holds 12 rows of points not in this spec" in capsys.readouterr().out
    assert main(["sweep", "plot", str(out), "--x", "memory_budget", "--hue", "strategy",
                 "--out", str(tmp_path / "p.png")]) == 0
    assert "note: rows that differ in decode_tokens (not on the plot's axes) are averaged" in capsys.readouterr().err
    assert main(["sweep", "plot", str(out), "--x", "memory_budget", "--hue", "decode_tokens",
                 "--out", str(tmp_path / "q.png")]) == 0
    assert "note: rows that differ in strategy (not on" in capsys.readouterr().err  # now the two strategies are
    assert main(["sweep", "heatmap", str(out), "--x", "memory_budget", "--y", "strategy",
                 "--out", str(tmp_path / "h.png")]) == 0
    assert "rows that differ in decode_tokens (not on" in capsys.readouterr().err
    assert main(["sweep", str(other), "--out", str(out), "--no-progress", "--prune"]) == 0
    assert "not in this spec" not in capsys.readouterr().out and len(read_results(out)) == 12


@pytest.mark.parametrize("args, message", [
    (["sweep", "nope.yaml", "--out", "r.parquet"], "no such spec file"),
    (["sweep", "{spec}", "--out", "r.parquet", "--dask", "remote"], "--dask: only 'local'"),
    (["sweep", "{spec}", "--out", "r.parquet", "--workers", "0"], "--workers: must be an integer in [1, 256]"),
    (["sweep", "{spec}", "--out", "r.parquet", "--scheduler", "host:1"], "expected a scheduler address"),
    (["sweep", "{bad}", "--out", "r.parquet"], "unknown setting 'budget'"),
    (["sweep", "plot", "{results}", "--x", "budget"], "--x: no column 'budget'"),
    (["sweep", "plot", "missing.parquet", "--x", "seed"], "no such results file"),
])
def test_cli_errors_are_one_line_with_exit_2(args, message, spec, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = write_spec(tmp_path, {"base": base(), "grid": {"budget": ["1GB"]}}, "bad.yaml")
    results = tmp_path / "ok.parquet"
    if "{results}" in args:
        assert main(["sweep", str(spec), "--out", str(results), "--no-progress"]) == 0
    argv = [a.format(spec=spec, bad=bad, results=results) for a in args]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plan_writes_a_plan_that_sim_run_accepts_and_reproduces(tmp_path, capsys):
    model = write_model(tmp_path)
    plan_file = tmp_path / "plan.yaml"
    common = ["--model", str(model), "--memory-budget", "302MB", "--preset", PRESET]
    assert main(["plan", *common, "--prune-tokens", "4", "--warmup-tokens", "4", "--confirm-tokens", "8",
                 "--passes", "1", "--out", str(plan_file)]) == 0
    printed = capsys.readouterr().out
    plan = yaml.safe_load(plan_file.read_text())
    assert yaml.safe_load(printed) == plan
    assert set(plan["knobs"]) == {"compute_cores", "io_cores", "cluster_neurons", "npu_activation_share",
                                  "hot_share", "policy", "hot_unit"}
    # the command the plan's header prints, as printed, reproduces its prediction
    use_it = plan_file.read_text().splitlines()[1].removeprefix("# use it: sim ")
    assert main([*shlex.split(use_it.replace("PLAN.yaml", str(plan_file))), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["decode_tokens_per_s"]
    run = ["run", *common, "--decode-tokens", "8", "--warmup-tokens", "4", "--json"]  # calibrated, as the plan
    assert main(run) == 0
    default = json.loads(capsys.readouterr().out)["decode_tokens_per_s"]
    assert planned == pytest.approx(plan["predicted"]["decode_tokens_per_s"], rel=1e-5)
    assert default == pytest.approx(plan["default_configuration"]["decode_tokens_per_s"], rel=1e-5)
    assert planned >= default
    # a plan holds what sim plan writes and nothing else; a typo is refused, not ignored
    from sim.commands.run import PLAN_KEYS

    assert set(plan) <= PLAN_KEYS
    for edit, message in (({**plan, "foo": 1}, "foo: unknown field(s) 'foo' in a plan"),
                          ({("knobz" if k == "knobs" else k): v for k, v in plan.items()}, "but no knobs section")):
        bad = tmp_path / "bad-plan.yaml"
        bad.write_text(yaml.safe_dump(edit))
        assert main([*run, "--plan", str(bad)]) == 2
        assert message in capsys.readouterr().err


def test_plan_for_an_edited_phone_records_its_edits_and_sim_run_reproduces_it(tmp_path, capsys):
    model = write_model(tmp_path)
    plan_file = tmp_path / "plan.yaml"
    common = ["--model", str(model), "--memory-budget", "302MB", "--preset", PRESET]
    edit = ["--set", "device.cpu.clusters.big.cores=3"]
    assert main(["plan", *common, *edit, "--prune-tokens", "2", "--warmup-tokens", "2", "--confirm-tokens", "4",
                 "--passes", "1", "--confirm", "1", "--out", str(plan_file)]) == 0
    capsys.readouterr()
    text = plan_file.read_text()
    plan = yaml.safe_load(text)
    assert plan["overrides"] == {"device.cpu.clusters.big.cores": 3}
    assert "--set device.cpu.clusters.big.cores=3 --plan PLAN.yaml" in text.splitlines()[1]  # the use-it line
    same_phone = ["--set", "device.cpu.clusters.0.cores=3"]  # the same edit, spelt by index: no warning
    run = ["run", *common, "--decode-tokens", "4", "--warmup-tokens", "2", "--plan", str(plan_file),
           "--json"]  # a plan's figures are calibrated runs, as sim run's
    assert main([*run, *edit]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["decode_tokens_per_s"] == pytest.approx(plan["predicted"]["decode_tokens_per_s"], rel=1e-5)
    assert not same["warnings"]
    assert main([*run, *same_phone]) == 0
    assert not json.loads(capsys.readouterr().out)["warnings"]
    # on the unedited phone: a layout only the edited phone has is refused, any other one warns
    code = main(run)
    captured = capsys.readouterr()
    if plan["knobs"]["compute_cores"].count("big") > 1:
        assert code == 2 and "compute threads on big" in captured.err
    else:
        assert code == 0 and any("another device profile: oneplus-12 with --set device.cpu.clusters.big.cores=3 "
                                 "(this run: oneplus-12)" in w for w in json.loads(captured.out)["warnings"])


def test_plan_plans_the_profile_it_is_given_as_a_mapping_or_object(tmp_path):
    """A mapping (or object) is the profile itself, not the bundled one of the same name."""
    import sim
    from sim.explore.resolve import digest

    edited = sim.edit_device("oneplus-12", {"cpu.clusters.big.cores": 2})
    kw = dict(memory_budget="302MB", preset=PRESET, prune_tokens=2, warmup_tokens=2, confirm_tokens=2, passes=1,
              confirm=1)
    model = str(write_model(tmp_path))
    as_mapping = sim.plan(edited.model_dump(mode="json"), model, **kw)
    as_object = sim.plan(edited, model, **kw)
    want = digest(edited.model_dump(mode="json"))
    assert as_mapping.profile_hashes["device"] == as_object.profile_hashes["device"] == want
    assert as_mapping.default.tokens_per_s == as_object.default.tokens_per_s
    text = as_object.to_yaml()  # its use-it line cannot name a bundled phone: it says what to pass
    assert "--device THE-PROFILE-YOU-PLANNED-FOR.yaml" in text and "device given as a profile object" in text
    assert f"--model {model} " in text  # a path stays the path


def test_plan_rejects_an_unreachable_speed(tmp_path, capsys):
    model = write_model(tmp_path)
    assert main(["plan", "--model", str(model), "--memory-budget", "302MB", "--preset", PRESET, "--prune-tokens",
                 "2", "--warmup-tokens", "2", "--confirm-tokens", "2", "--passes", "1", "--confirm", "1",
                 "--min-tokens-per-s", "1e9"]) == 2
    assert "no plan reaches 1e+09 tokens/s" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "expected"), [
    (["--memory-budget", "lots"], "error: --memory-budget: cannot parse 'lots'"),
    (["--memory-budget", "302MB", "--preset", "no-such-preset"], "error: --preset: no synthetic-trace preset"),
    (["--memory-budget", "302MB", "--seed", "-1"], "error: --seed: must be an integer in [0, 2**63 - 1], got -1"),
])
def test_plan_bad_input_names_the_flag_before_searching(tmp_path, capsys, monkeypatch, options, expected):
    """Checked as `sim run` checks them, before any candidate is simulated."""
    import sim.explore.planner as planner

    def no_search(*args, **kwargs):
        raise AssertionError("searched before checking the options")

    monkeypatch.setattr(planner, "_Search", no_search)
    assert main(["plan", "--model", str(write_model(tmp_path)), *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1, err


def test_a_dry_run_writes_nothing_not_even_the_output_folder(spec, tmp_path, capsys):
    out = tmp_path / "later" / "r.parquet"
    assert main(["sweep", str(spec), "--out", str(out), "--dry-run"]) == 0
    assert "12 points, 0 already in" in capsys.readouterr().out
    assert not (tmp_path / "later").exists()
    assert main(["sweep", str(tmp_path), "--out", str(out)]) == 2  # a folder given as the spec
    assert "is a folder; give a spec file (.yaml)" in capsys.readouterr().err
