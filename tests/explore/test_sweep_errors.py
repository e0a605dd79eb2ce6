"""`sim sweep` on bad input, failing points, interruption and bad output paths (exit statuses 1, 2, 130, 143)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from explore_helpers import base, write_spec

from sim.cli import main
from sim.errors import SimError
from sim.explore.store import read_results

PNG = b"\x89PNG"


def _files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("spec, field, message", [
    ({"base": base(memory_budget="302MB"), "grid": {"offload": [0.2, 0.5]}},
     "grid.offload", "give either a memory budget or an offload fraction, not both"),
    ({"base": base(decode_tokens=-8)}, "base.decode_tokens", "must be an integer >= 1, got -8"),
    ({"base": base(), "grid": {"memory_budget": ["302MB", "abc"]}}, "grid.memory_budget", "cannot parse 'abc'"),
    ({"base": base(), "grid": {"strategy": ["powerinfer2", "bogus"]}}, "grid.strategy", "unknown strategy 'bogus'"),
    ({"base": base(memory_budget="302MB"), "seeds": [0, -1]}, "seeds", "must be an integer in [0, 2**63 - 1], got -1"),
    ({"base": base(), "grid": {"device.storage.rand_read.0.gbps": [1.0, -2.0]}},
     "grid.device.storage.rand_read.0.gbps", "must be >= 1e-06"),
    ({"base": base(), "grid": {"device.storage.rand_read.*.gbps:scale": [1, -1]}},
     "grid.device.storage.rand_read.*.gbps:scale", "storage.rand_read.0.gbps: must be >= 1e-06"),
    ({"base": base(), "grid": {"flash": [{"label": "slow", "device.storage.read_latency_us": -5}]}},
     "grid.flash.0.device.storage.read_latency_us", "got -5"),
    ({"base": base(), "points": [{"knobs.cluster_neurons": 64}, {"knobs.cluster_neurons": 0}]},
     "points.1.knobs.cluster_neurons", "cluster_neurons"),
    ({"base": base(knobs={"compute_cores": ["huge"]})}, "base.knobs.compute_cores", "unknown CPU cluster 'huge'"),
    ({"base": base(), "sample": {"n": 4, "ranges": {"policy": {"choices": ["lru", "nope"]}}}},
     "sample.ranges.policy", "unknown policy 'nope'"),
    ({"base": base(preset="no-such-preset")}, "base.preset", "no synthetic-trace preset 'no-such-preset'"),
    ({"base": base(), "grid": {"model.sparsity.mean_active_fraction": [0.1, 0.2]}},
     "grid.model.sparsity.mean_active_fraction", "not read by the simulation, so editing it would change no result"),
    ({"base": base(), "grid": {"device.cpu.clusters.big.cores:scale": [1, 1.5]}},
     "grid.device.cpu.clusters.big.cores:scale", "must be an integer, got 1.5"),
    ({"base": base(), "grid": {"device.cpu.clusters.big.cores": [1, 2], "device.cpu.clusters.0.cores": [3]}},
     "grid.device.cpu.clusters.0.cores", "which device.cpu.clusters.big.cores changes too"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_bad_spec_values_stop_before_any_point_with_file_and_field(spec, field, message, dry_run, tmp_path, capsys):
    path = write_spec(tmp_path, {"name": "bad", **spec}, "b10.yaml")
    before = _files(tmp_path)
    argv = ["sweep", str(path), "--out", str(tmp_path / "r.parquet"), "--no-progress"]
    assert main(argv + (["--dry-run"] if dry_run else [])) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {path}: {field}: ") and captured.err.count("\n") == 1, captured.err
    assert message in captured.err
    assert captured.out == ""
    assert _files(tmp_path) == before  # nothing ran: no results, no parts, no lock


def test_infeasible_points_are_written_with_their_columns_and_exit_1(tmp_path, capsys):
    spec = write_spec(tmp_path, {"name": "inf", "base": base(decode_tokens=2, warmup_tokens=2),
                                 "grid": {"memory_budget": ["1MB", "302MB"], "strategy": ["powerinfer2", "llamacpp"]},
                                 "seeds": [3]})
    out = tmp_path / "r.parquet"
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "4 points, 0 already done, 4 run, 2 failed" in captured.out
    assert captured.err.startswith("error: 2 of 4 points failed") and captured.err.count("\n") == 1
    assert "first failure: --memory-budget: budget 1.00 MB is below" in captured.err
    df = read_results(out)
    failed = df[df["status"] == "failed"]
    assert list(failed["memory_budget"]) == ["1MB", "1MB"]
    assert list(failed["strategy"]) == ["powerinfer2", "llamacpp"]
    assert list(failed["seed"]) == [3, 3]
    for column in ("device", "model", "decode_tokens", "knobs.policy", "project_version", "model_hash"):
        assert failed[column].notna().all(), column
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 1  # still failed: still 1
    assert "0 run, 2 failed" in capsys.readouterr().out


def _as_from_a_terminal() -> None:
    """The child's SIGINT and SIGTERM at their defaults, as a command typed in a terminal has
    them: a test run started in the background (``cmd &`` in a non-interactive shell, as CI
    may be) passes SIGINT on ignored, and Python then leaves Ctrl-C ignored in the sweep too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_and_signal(spec, out, signum: int, workers: int) -> subprocess.CompletedProcess:
    """Start the sweep CLI, send ``signum`` to it once two rows are durable, and wait for it."""
    argv = [sys.executable, "-m", "sim", "sweep", str(spec), "--out", str(out), "--workers", str(workers),
            "--no-progress", "--commit-every", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_from_a_terminal)
    parts = out.with_name(out.name + ".parts")
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and len(list(parts.glob("part-*.parquet"))) < 2:
        time.sleep(0.005)
    assert proc.poll() is None, "the sweep should still be running when signalled"
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("signum, workers, status", [(signal.SIGTERM, 1, 143), (signal.SIGINT, 2, 130)],
                         ids=["sigterm-in-process", "sigint-2-workers"])
def test_an_interrupted_sweep_merges_its_finished_rows_and_resumes(signum, workers, status, tmp_path):
    spec = write_spec(tmp_path, {"name": "stop", "base": base(decode_tokens=48),
                                 "grid": {"memory_budget": ["301.6MB", "302MB", "303MB"],
                                          "strategy": ["powerinfer2", "llm-in-flash", "llamacpp"]},
                                 "seeds": list(range(8))})
    out = tmp_path / "r.parquet"
    done = _run_and_signal(spec, out, signum, workers)
    assert done.returncode == status, done.stderr
    kept = read_results(out)  # the results file itself, not only parts
    assert 2 <= len(kept) < 72 and kept["point_id"].is_unique and (kept["status"] == "ok").all()
    lines = done.stderr.splitlines()  # the last line (a library may warn before it), and no traceback
    assert lines[-1] == f"interrupted: {len(kept)} of 72 points kept in {out}; run the same command again to resume"
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r.parquet.parts").exists()
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 0
    assert len(read_results(out)) == 72


def test_sigterm_is_handled_only_while_the_sweep_runs(tmp_path):
    from sim.explore.sweep import run_sweep

    spec = write_spec(tmp_path, {"base": base(decode_tokens=2, warmup_tokens=2), "points": [{"memory_budget": "1MB"}]})
    during = []
    mine = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        report = run_sweep(spec, tmp_path / "r.parquet", progress=False,
                           on_row=lambda _row: during.append(signal.getsignal(signal.SIGTERM)))
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, mine)
    assert len(during) == 1 and callable(during[0])
    assert report.failed == 1 and "must stay resident" in report.first_error


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plots")
    spec = write_spec(folder, {"name": "p", "base": base(decode_tokens=2, warmup_tokens=2),
                               "grid": {"memory_budget": ["302MB", "303MB"], "strategy": ["powerinfer2", "llamacpp"]}})
    out = folder / "r.parquet"
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.mark.parametrize("args, message", [
    (["plot", "{r}", "--x", "memory_budget", "--y", "strategy"], "error: --y: 'strategy' is not numeric; numeric "
                                                                  "columns: "),
    (["heatmap", "{r}", "--x", "memory_budget", "--y", "strategy", "--value", "error"],
     "error: --value: 'error' has no value in any successful row; numeric columns: "),
    (["heatmap", "{r}", "--x", "memory_budget", "--y", "strategy", "--value", "device"],
     "error: --value: 'device' is not numeric"),
])
def test_plots_refuse_a_metric_that_is_not_numeric(args, message, results, tmp_path, capsys):
    target = tmp_path / "p.png"
    assert main(["sweep", *[a.format(r=results) for a in args], "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert "decode_tokens_per_s" in err and "'strategy'," not in err.split("columns:")[1]
    assert not target.exists()


def test_plots_read_rows_a_stopped_sweep_left_in_parts(results, tmp_path, capsys):
    out = tmp_path / "r.parquet"
    parts = tmp_path / "r.parquet.parts"
    parts.mkdir()
    assert main(["sweep", "plot", str(out), "--x", "memory_budget"]) == 2
    assert "no finished rows yet" in capsys.readouterr().err  # a folder without rows
    shutil.copy(results, parts / "part-00000000000000000001-1-000001-aaaaaaaa.parquet")
    target = tmp_path / "p.svg"
    assert main(["sweep", "plot", str(out), "--x", "memory_budget", "--hue", "strategy", "--out", str(target)]) == 0
    assert "run it again to finish" in capsys.readouterr().err
    assert target.read_text().lstrip().startswith("<?xml")
    pd.testing.assert_frame_equal(read_results(out).sort_values("point_id", ignore_index=True),
                                  read_results(results).sort_values("point_id", ignore_index=True),
                                  check_like=True)


@pytest.mark.parametrize("args, message", [
    (["{spec}", "--out", "{tmp}/r.csv"], "r.csv: --out: unsupported extension '.csv'; allowed: .parquet"),
    (["{spec}", "--out", "{tmp}/spec.yaml/r.parquet"], "spec.yaml/r.parquet: --out: cannot write"),
    (["plot", "{results}", "--x", "memory_budget", "--out", "{tmp}/p.txt"],
     "p.txt: --out: unsupported extension '.txt'; allowed: .png, .pdf, .svg"),
    (["heatmap", "{results}", "--x", "memory_budget", "--y", "strategy", "--out", "{tmp}/h.jpeg"],
     "h.jpeg: --out: unsupported extension '.jpeg'"),
])
def test_output_paths_are_checked_before_any_work(args, message, results, tmp_path, capsys):
    spec = write_spec(tmp_path, {"name": "o", "base": base(), "grid": {"memory_budget": ["302MB"]}})
    before = _files(tmp_path)
    argv = ["sweep", *[a.format(spec=spec, tmp=tmp_path, results=results) for a in args], "--no-progress"] \
        if "plot" not in args and "heatmap" not in args else \
        ["sweep", *[a.format(spec=spec, tmp=tmp_path, results=results) for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert _files(tmp_path) == before


def test_library_entry_points_check_their_arguments(tmp_path):
    """run_sweep and plan refuse bad arguments in one line before any point runs or any file is written."""
    import sim

    spec = {"base": {"model": "turbosparse-mistral-7b", "decode_tokens": 2, "warmup_tokens": 2, "mode": "analytic"},
            "points": [{"offload": 0.5}]}
    cases = [(lambda: sim.run_sweep(spec, None), "out"),
             (lambda: sim.run_sweep(spec, tmp_path / "r.csv"), "--out"),
             (lambda: sim.run_sweep(spec, tmp_path / "r.parquet", commit_every_s=float("nan")), "--commit-every"),
             (lambda: sim.run_sweep(["not", "a", "spec"], tmp_path / "r.parquet"), "spec"),
             (lambda: sim.plan("oneplus-12", "turbosparse-mistral-7b", memory_budget="3GB", min_tokens_per_s="5"),
              "--min-tokens-per-s"),
             (lambda: sim.plan("oneplus-12", "turbosparse-mistral-7b", memory_budget="3GB", confirm_tokens=10**9),
              "--confirm-tokens"),
             (lambda: sim.plan("oneplus-12", "turbosparse-mistral-7b", memory_budget="1KB"), "--memory-budget")]
    for call, field in cases:
        with pytest.raises(SimError) as info:
            call()
        assert info.value.field == field, info.value
    assert not any(tmp_path.iterdir())  # nothing written
    report = sim.run_sweep(spec, tmp_path / "r.parquet", progress=False, workers=np.int64(1))
    assert report.total == 1


def test_plots_refuse_an_axis_left_at_its_default(results, tmp_path, capsys):
    """A hue that is None in every row (a run option the spec never set) would draw one unlabelled line."""
    target = tmp_path / "p.png"
    assert main(["sweep", "plot", str(results), "--x", "memory_budget", "--y", "decode_tokens_per_s",
                 "--hue", "policy", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --hue: 'policy' has no value in any successful row") and err.count("\n") == 1
    assert "columns that vary: memory_budget, strategy" in err and not target.exists()


def test_a_signal_that_lands_in_a_compiled_kernel_stops_the_sweep_not_the_point(monkeypatch):
    """CPython reports a handler's exception raised during a C call as a SystemError caused by
    it; run_point must pass the interrupt on, not record a failed point and carry on."""
    from sim.explore import worker
    from sim.explore.sweep import SweepInterrupted

    def interrupted(task):
        try:
            raise SweepInterrupted(signal.SIGTERM)
        except SweepInterrupted as signal_exc:
            raise SystemError("CPUDispatcher(<function _gather_rows>) returned a result with an exception "
                              "set") from signal_exc

    monkeypatch.setattr(worker, "_simulate", interrupted)
    with pytest.raises(SweepInterrupted):
        worker.run_point({"id": "p"})
    monkeypatch.setattr(worker, "_simulate", lambda task: 1 / 0)
    assert worker.run_point({"id": "p"})["error"] == "ZeroDivisionError: division by zero"  # a real failure


def test_a_renamed_model_keeps_its_own_preset_in_a_sweep_too():
    from sim.explore.resolve import resolve_settings

    task = resolve_settings({"model": "turbosparse-mixtral-47b", "model.name": "my-mixtral"})
    assert task["model"]["name"] == "my-mixtral"
    assert task["trace"]["preset"] == "turbosparse-mixtral-47b"  # the base model's activations
    # another bundled model's name would label Mixtral's figures as that model's
    with pytest.raises(SimError, match="'turbosparse-mistral-7b' is another bundled model"):
        resolve_settings({"model": "turbosparse-mixtral-47b", "model.name": "turbosparse-mistral-7b"})


def test_a_point_id_covers_the_simulator_code(monkeypatch):
    """After a code change (a git pull in an editable install) a resumed sweep must run its
    points again, not keep rows of the old simulator beside new ones as if one."""
    from sim.explore import resolve

    settings = {"model": "turbosparse-mistral-7b", "memory_budget": "3GB"}
    before = resolve.resolve_settings(settings)
    assert before["version"].endswith("+" + resolve.code_digest())
    monkeypatch.setattr(resolve, "code_digest", lambda: "0123456789ab")
    after = resolve.resolve_settings(settings)
    assert after["id"] != before["id"] and after["version"].endswith("+0123456789ab")


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"scheduler": 5}, "--scheduler"), ({"workers": 2**40}, "--workers"), ({"on_row": "x"}, "on_row"),
    ({"prune": "yes"}, "prune"), ({"progress": None}, "progress"),
])
def test_run_sweep_refuses_bad_arguments_before_writing_anything(tmp_path, kwargs, field):
    from sim.explore.sweep import run_sweep

    spec = {"base": {"model": "turbosparse-mistral-7b", "decode_tokens": 2, "memory_budget": "3GB"}}
    with pytest.raises(SimError, match=f"^{field}: "):
        run_sweep(spec, tmp_path / "r.parquet", **kwargs)
    assert not list(tmp_path.iterdir())
