"""`sim run`: the JSON contract, the timeline outputs, and one-line errors for bad input.

Runs go through ``sim.cli.main(argv)`` (the console script's entry point) on a tiny model
file and a tiny trace file, so each takes well under a second.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import engine_helpers as h
import matplotlib.image
import pytest

from sim.cli import main
from sim.engine.simulation import simulate

CONTRACT_KEYS = ("decode_tokens_per_s", "prefill_tokens_per_s", "ttft_s", "latency_ms_mean", "latency_ms_p99",
                 "cache_hit_ratio", "flash_bytes_per_token", "memory", "utilisation")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("cli")
    model = h.write_yaml(folder / "tiny-moe.yaml", h.TINY_MOE)
    trace = h.trace(h.model(), 12).save(folder / "tiny-moe.npz")
    other = h.trace(h.model(h.TINY_DENSE), 12).save(folder / "tiny-dense.npz")
    return {"model": str(model), "trace": str(trace), "other_trace": str(other), "dir": str(folder)}


def argv(files: dict[str, str], **options: str) -> list[str]:
    opts = {"--model": files["model"], "--trace": files["trace"], "--decode-tokens": "6", "--warmup-tokens": "4",
            "--prompt-tokens": "8", "--offload": "0.5"}
    opts.update(options)
    out = ["run"]
    for key, value in opts.items():
        if value is None:
            continue
        out += [key] if value == "" else [key, value]
    return out


def test_json_carries_the_contract_keys(files, capsys):
    assert main([*argv(files), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in CONTRACT_KEYS:
        assert key in out, key
    assert out["decode_tokens_per_s"] > 0 and out["prefill_tokens_per_s"] > 0
    assert out["decode_tokens_per_s"] == pytest.approx(1e3 / out["latency_ms_mean"])
    assert out["ttft_s"] == pytest.approx(8 / out["prefill_tokens_per_s"])
    assert out["latency_ms_p99"] >= out["latency_ms_p50"] > 0
    assert 0 < out["cache_hit_ratio"] <= 1
    assert out["flash_bytes_per_token"] > 0
    memory = out["memory"]
    assert memory["neuron_cache"] > 0 and memory["ffn_resident_fraction"] == pytest.approx(0.5, abs=1e-6)
    assert sum(v for k, v in memory.items() if k not in ("budget_bytes", "ffn_resident_fraction")) == \
        pytest.approx(memory["budget_bytes"], abs=2)
    units = out["utilisation"]
    assert {"npu", "storage"} <= set(units) and any(u.startswith("cpu:") for u in units)
    assert all(0 <= v <= 1 + 1e-9 for v in units.values())


def test_table_output_names_the_figures(files, capsys):
    assert main(argv(files)) == 0
    text = capsys.readouterr().out
    assert "decode_tokens_per_s" in text and "where decode time goes" in text


def test_analytic_mode_from_the_cli(files, capsys):
    assert main([*argv(files, **{"--mode": "analytic"}), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "analytic" and out["decode_tokens_per_s"] > 0


def test_timeline_is_chrome_trace_event_json(files, tmp_path, capsys):
    path = tmp_path / "timeline.json"
    assert main([*argv(files), "--timeline", str(path), "--json"]) == 0
    capsys.readouterr()
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    assert spans
    for e in spans:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert e["tid"] in names
    tracks = set(names.values())
    assert "npu" in tracks and "storage" in tracks
    assert any(t.startswith("cpu:") for t in tracks) and any(t.startswith("io") for t in tracks)
    # One track per unit: a thread, the NPU or the single UFS queue does one thing at a time.
    for tid in names:
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == tid)
        assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(mine))


def test_spans_account_for_every_busy_second(files):
    m = h.model()
    result = simulate(h.device(), m, "powerinfer2", trace=h.trace(m, 12), decode_tokens=6, prompt_tokens=8,
                      warmup_tokens=4, offload=0.5, timeline=True)
    assert result.usage is not None
    per_unit: dict[str, float] = {}
    for s in result.spans:
        per_unit[s.unit] = per_unit.get(s.unit, 0.0) + (s.end_s - s.start_s)
    assert set(per_unit) == set(result.usage.busy_s)
    for unit, seconds in result.usage.busy_s.items():
        assert per_unit[unit] == pytest.approx(seconds, rel=1e-9), unit


def test_gantt_writes_a_png(files, tmp_path, capsys):
    path = tmp_path / "gantt.png"
    assert main([*argv(files), "--gantt", str(path), "--json"]) == 0
    capsys.readouterr()
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100


BAD = {
    "unknown device": {"--device": "no-such-phone"},
    "unparsable budget": {"--memory-budget": "lots", "--offload": None},
    "budget below resident": {"--memory-budget": "1KB", "--offload": None},
    "unknown strategy": {"--strategy": "warp-drive"},
    "unknown knob": {"--set": "no_such_knob=1"},
    "knob out of range": {"--set": "cluster_neurons=-3"},
    "knob without value": {"--set": "cluster_neurons"},
    "trace of another model": {"--trace": "OTHER"},
    "unknown mode": {"--mode": "fast"},
    "unknown policy": {"--policy": "nope"},
    "offload above one": {"--offload": "2"},
    "trace too short": {"--decode-tokens": "50"},
    "missing trace file": {"--trace": "MISSING"},
    "unknown weights dtype": {"--weights-dtype": "int3"},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(files, capsys, case):
    options = dict(BAD[case])
    if options.get("--trace") == "OTHER":
        options["--trace"] = files["other_trace"]
    elif options.get("--trace") == "MISSING":
        options["--trace"] = str(Path(files["dir"]) / "missing.npz")
    assert main([*argv(files, **options), "--json"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in captured.err and captured.out == ""
