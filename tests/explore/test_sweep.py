"""The sweep runner: exact rows, failures as data, resume, executors agree, SIGKILL-safe."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from explore_helpers import PRESET, base, comparable, write_spec

from sim.engine.simulation import simulate
from sim.errors import SimError
from sim.explore.store import ResultStore, read_results
from sim.explore.sweep import run_sweep
from sim.explore.worker import flatten_summary

GRID = {
    "memory_budget": ["301.6MB", "302MB", "1MB"],  # 1 MB is below what must stay resident: those points fail
    "strategy": ["powerinfer2", "llm-in-flash", "llamacpp"],
}


@pytest.fixture()
def spec(tmp_path):
    return write_spec(tmp_path, {"name": "t", "base": base(), "grid": GRID, "seeds": [0, 1]})


@pytest.mark.parametrize("calibration", ["none", None])
def test_a_row_holds_exactly_what_simulate_returns(tmp_path, calibration):
    """Uncalibrated, a row is simulate's summary; by default it is sim run's, the bundled
    calibration applied (the row names it)."""
    from sim.calibrate.apply import calibrated_config
    from sim.calibrate.calibration import load_calibration
    from sim.engine.config import RunConfig

    settings = {"calibration": calibration} if calibration else {}
    spec = write_spec(tmp_path, {"base": {**base(decode_tokens=6, mode="des"), **settings},
                                 "points": [{"memory_budget": "302MB", "knobs.cluster_neurons": 64}]})
    df = run_sweep(spec, tmp_path / "r.parquet", progress=False).results
    assert len(df) == 1 and df["status"].iloc[0] == "ok"
    config = RunConfig.of(device="oneplus-12", model=str(tmp_path / "tiny-moe.yaml"), strategy="powerinfer2",
                          preset=PRESET, memory_budget="302MB", decode_tokens=6, warmup_tokens=4,
                          knobs={"cluster_neurons": 64})
    cal = load_calibration(calibration)
    direct = simulate(calibrated_config(config, cal))
    assert df["calibration"].iloc[0] == (cal.source if cal else "none")
    want = flatten_summary(direct.summary)
    row = df.iloc[0]
    for key, value in want.items():
        if pd.isna(value) or pd.isna(row[key]):  # a missing value, however the column stores it
            assert pd.isna(value) and pd.isna(row[key]), key
        elif isinstance(value, float):
            assert row[key] == pytest.approx(value, rel=0, abs=0), key
        else:
            assert row[key] == value, key
    assert row["knobs.cluster_neurons"] == 64 and row["strategy"] == "powerinfer2"


def test_failing_points_are_recorded_and_the_rest_finish_then_resume_skips_all(spec, tmp_path):
    out = tmp_path / "r.parquet"
    report = run_sweep(spec, out, progress=False)
    df = report.results
    assert report.total == len(df) == 18 and report.ran == 18
    failed = df[df["status"] == "failed"]
    assert len(failed) == 6 and set(failed["memory_budget"]) == {"1MB"}
    assert failed["error"].str.contains("must stay resident").all()
    ok = df[df["status"] == "ok"]
    assert ok["decode_tokens_per_s"].gt(0).all() and ok["error"].isna().all()
    again = run_sweep(spec, out, progress=False)
    assert again.ran == 0 and again.skipped == 18
    pd.testing.assert_frame_equal(again.results, df)
    retried = run_sweep(spec, out, progress=False, retry_failed=True)
    assert retried.ran == 6 and len(retried.results) == 18


def test_settings_that_do_not_resolve_stop_the_sweep_before_anything_runs(tmp_path):
    spec = write_spec(tmp_path, {"base": base(memory_budget="302MB"),
                                 "grid": {"device.dram.usable_bytes": ["12GB", "99GB"]}})
    with pytest.raises(SimError, match=r"usable_bytes.* must not exceed total_bytes") as info:
        run_sweep(spec, tmp_path / "r.parquet", progress=False)
    assert (info.value.source, info.value.field) == (str(spec), "grid.device.dram.usable_bytes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml", "tiny-moe.yaml"]  # no store at all


def test_workers_1_2_and_dask_give_identical_results(tmp_path):
    spec = write_spec(tmp_path, {"name": "t", "base": base(), "grid": GRID, "seeds": [3]})
    one = run_sweep(spec, tmp_path / "one.parquet", workers=1, progress=False).results
    two = run_sweep(spec, tmp_path / "two.parquet", workers=2, progress=False).results
    pd.testing.assert_frame_equal(comparable(one), comparable(two))
    assert one["worker"].nunique() == 1 and two["worker"].nunique() >= 2
    pytest.importorskip("distributed")
    dask = run_sweep(spec, tmp_path / "dask.parquet", workers=2, scheduler="local", progress=False).results
    pd.testing.assert_frame_equal(comparable(one), comparable(dask))


def test_a_worker_killed_mid_sweep_is_replaced_and_its_points_rerun(tmp_path):
    spec = write_spec(tmp_path, {"name": "t", "base": base(decode_tokens=32), "grid": GRID, "seeds": [5]})
    reference = run_sweep(spec, tmp_path / "ref.parquet", progress=False).results
    killed: list[int] = []

    def kill_once(row: dict) -> None:  # SIGKILL the worker that sent the first row (OOM-killer style)
        if not killed:
            killed.append(int(row["worker"].rsplit(":", 1)[1]))
            os.kill(killed[0], signal.SIGKILL)
            _wait_until_dead(killed[0])  # else the other worker may finish every point before the pool notices

    report = run_sweep(spec, tmp_path / "r.parquet", workers=2, progress=False, on_row=kill_once)
    assert killed and report.results["worker"].nunique() > 2  # a fresh pool took over
    pd.testing.assert_frame_equal(comparable(report.results), comparable(reference))


def _wait_until_dead(pid: int, timeout_s: float = 30.0) -> None:
    """Until ``pid`` has exited (a zombie counts: its parent has not reaped it yet)."""
    status = Path(f"/proc/{pid}/status")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = next(line for line in status.read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            return
        if "Z" in state.split()[1]:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} still runs {timeout_s} s after SIGKILL")


def _sweep_process(spec, out, workers: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "sim", "sweep", str(spec), "--out", str(out), "--workers", str(workers),
            "--no-progress", "--commit-every", "0"]
    # Its own process group, so the kill takes its worker processes too (as a crash would).
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _kill_group(proc: subprocess.Popen) -> bool:
    """SIGKILL the sweep and its workers; True when it was still running."""
    running = proc.poll() is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return running


def _durable_rows(parts) -> int:
    import pyarrow.parquet as pq

    n = 0
    for p in parts.glob("part-*.parquet") if parts.exists() else []:
        with contextlib.suppress(OSError, ValueError):  # compacted away meanwhile
            n += pq.read_metadata(p).num_rows
    return n


def test_sigkill_at_random_points_then_restart_gives_the_uninterrupted_rows(tmp_path):
    spec = write_spec(tmp_path, {"name": "kill", "base": base(decode_tokens=32), "grid": GRID,
                                 "seeds": [0, 1, 2, 3, 4]})
    reference = run_sweep(spec, tmp_path / "ref.parquet", progress=False).results
    out = tmp_path / "killed.parquet"
    parts = tmp_path / "killed.parquet.parts"
    rng = random.Random(7)
    hits = 0
    for round_ in range(3):
        proc = _sweep_process(spec, out, workers=2 if round_ % 2 == 0 else 1)
        want = _durable_rows(parts) + rng.randint(1, 6)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and _durable_rows(parts) < want:
            time.sleep(0.01)  # until a random number of further rows is durable ...
        time.sleep(rng.uniform(0.0, 0.05))  # ... and a moment later (mid-point, mid-write or mid-commit)
        hits += _kill_group(proc)
    assert hits == 3, "every kill should land while the sweep runs"
    stored = ResultStore(out).load()
    assert 0 < len(stored) < len(reference), "the kills should leave a partial store"
    final = subprocess.run([sys.executable, "-m", "sim", "sweep", str(spec), "--out", str(out), "--workers", "2",
                            "--no-progress"], capture_output=True, text=True, timeout=120)
    assert final.returncode == 1, final.stderr  # the 1 MB points fail: infeasible, recorded, exit status 1
    assert f"{len(stored)} already done" in final.stdout
    result = read_results(out)
    assert result["point_id"].is_unique
    assert list(result["point_id"]) == list(reference["point_id"])
    pd.testing.assert_frame_equal(comparable(result), comparable(reference))


def test_an_axis_of_profile_objects_is_labelled_by_name_and_digest(tmp_path):
    """From Python, a grid may list edited phones: each row says which, readably."""
    import sim

    edited = sim.edit_device("oneplus-12", {"cpu.clusters.big.cores": 2})
    spec = {"name": "objs", "base": {"model": "turbosparse-mistral-7b", "decode_tokens": 4, "warmup_tokens": 2,
                                     "profile_tokens": 4, "mode": "analytic", "offload": 0.5},
            "grid": {"device": [edited, "oneplus-12"]}}
    rows = run_sweep(spec, tmp_path / "r.parquet", progress=False).results.set_index("device_hash")
    assert len(rows) == 2
    for device_hash, row in rows.iterrows():
        assert row["device"] in ("oneplus-12", f"oneplus-12#{device_hash[:8]}")
    assert rows["device"].str.contains("#").sum() == 1


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_pool_workers_end_soon_after_the_process_that_started_them_is_killed():
    """SIGKILL on a sweep runs no clean-up: its workers must not live on (finishing points
    nobody stores, holding the caller's pipe open) but follow it within seconds."""
    script = ("import os, time\n"
              "from sim.explore.executors import PoolExecutor\n"
              "pool = PoolExecutor(1)._new_pool()\n"
              "print(pool.submit(os.getpid).result(), flush=True)\n"
              "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline())
    proc.kill()
    proc.wait()

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 30
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker), "the pool worker outlived the killed sweep"
