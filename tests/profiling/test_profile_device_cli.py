"""`sim profile-device` end to end at a tiny size: a schema-valid, fully commented profile
that `sim profiles validate` accepts and `sim run --device` simulates; bad options fail in
one line; the test file never outlives the run, Ctrl-C included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from profile_helpers import uncommented_numeric_lines

from sim.cli import main
from sim.profiles.registry import load_device
from sim.profiling import runner
from sim.profiling.storage import PROBE_PREFIX

TINY = ["--quick", "--max-bytes", "4MiB", "--measure-s", "0.02"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("profiling")
    out = folder / "tiny-box.yaml"
    with pytest.MonkeyPatch.context() as mp:  # DRAM arrays of 8 MiB: the pipeline, not the figure, is tested here
        mp.setattr(runner, "_dram_array_bytes", lambda threads: 8 * 1024 * 1024)
        assert main(["profile-device", "--out", str(out), "--storage-path", str(folder), *TINY]) == 0
    return out, folder


def test_writes_a_valid_profile_with_every_number_sourced(measured, capsys):
    out, folder = measured
    text = out.read_text()
    device = load_device(out)
    assert device.name == "tiny-box"
    assert uncommented_numeric_lines(text) == []
    numbered = [line for line in text.splitlines() if "#" in line and not line.lstrip().startswith("#")]
    assert numbered and all(("measured: " in line) or ("assumed" in line) for line in numbered)
    assert device.storage.rand_read[0].gbps > 0 and device.cpu.mem_gbps > 0
    assert not [p for p in folder.iterdir() if p.name.startswith(PROBE_PREFIX)]
    assert main(["profiles", "validate", str(out)]) == 0
    assert "ok:" in capsys.readouterr().out


def test_sim_run_simulates_the_measured_device(measured, capsys):
    out, _ = measured
    rc = main(["run", "--device", str(out), "--model", "turbosparse-mistral-7b", "--prompt-tokens", "2",
               "--decode-tokens", "2", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["decode_tokens_per_s"] > 0


def test_measured_against_bundled_diff(measured, capsys):
    out, _ = measured
    assert main(["profiles", "diff", str(out), "oneplus-12", "--json"]) == 0
    rows = {r["field"]: r for r in json.loads(capsys.readouterr().out)}
    mine = load_device(out).cpu.mem_gbps
    assert rows["cpu.mem_gbps"]["ratio"] == pytest.approx(43.9 / mine)


@pytest.mark.parametrize("args, needle", [
    (["--max-bytes", "10"], "--max-bytes"),
    (["--max-bytes", "lots"], "--max-bytes"),
    (["--storage-path", "/nonexistent/folder"], "--storage-path"),
    (["--measure-s", "0"], "--measure-s"),
])
def test_bad_options_fail_in_one_line(tmp_path, capsys, args, needle):
    out = tmp_path / "box.yaml"
    assert main(["profile-device", "--out", str(out), "--quick", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("name", ["box.txt", "My Box.yaml"])
def test_bad_out_names_fail(tmp_path, capsys, name):
    assert main(["profile-device", "--out", str(tmp_path / name), *TINY]) == 2
    assert "--out" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_removes_the_test_file(tmp_path):
    out = tmp_path / "box.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "sim", "profile-device", "--out", str(out), "--max-bytes",
                             "64MiB", "--measure-s", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "80"})
    deadline = time.monotonic() + 120
    while not [p for p in tmp_path.iterdir() if p.name.startswith(PROBE_PREFIX)]:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    time.sleep(0.5)  # inside the write or the first reads
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert list(tmp_path.iterdir()) == []
