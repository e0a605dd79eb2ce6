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
    # the resolved configuration rides along: enough to rerun the same point
    config = out["config"]
    assert config["decode_tokens"] == 6 and config["offload"] == 0.5 and config["strategy"] == "powerinfer2"
    assert config["knobs"]["cluster_neurons"] > 0 and config["cores"]["compute"] and config["cores"]["io"]
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
    "budget in bits": {"--memory-budget": "12Gb", "--offload": None},
    "fraction of a byte": {"--memory-budget": "1.5", "--offload": None},
    "unknown strategy": {"--strategy": "warp-drive"},
    "unknown knob": {"--set": "no_such_knob=1"},
    "knob out of range": {"--set": "cluster_neurons=-3"},
    "knob without value": {"--set": "cluster_neurons"},
    "unknown profile field": {"--set": "device.storage.nope=1"},
    "profile field out of range": {"--set": "device.cpu.clusters.big.cores=0"},
    "profile field of the wrong type": {"--set": "model.n_layers=x"},
    "trace of another model": {"--trace": "OTHER"},
    "unknown mode": {"--mode": "fast"},
    "unknown policy": {"--policy": "nope"},
    "offload above one": {"--offload": "2"},
    "trace too short": {"--decode-tokens": "50"},
    "missing trace file": {"--trace": "MISSING"},
    "unknown weights dtype": {"--weights-dtype": "int3"},
    "context beyond max_context": {"--prompt-tokens": "600"},
    "offline policy in a timed run": {"--policy": "belady"},
    "profile policy without a profile": {"--strategy": "llm-in-flash", "--policy": "static-hot"},
    "dense with a cache policy": {"--strategy": "dense", "--offload": None, "--policy": "lru"},
    "timeline in analytic mode": {"--mode": "analytic", "--timeline": "OUT/t.json"},
    "timeline to a folder": {"--timeline": "OUT"},
    "gantt with an unknown format": {"--gantt": "OUT/g.txt"},
    "tokens csv where nothing can be written": {"--tokens-csv": "/proc/no/tokens.csv"},
}

# (the option the message must name, text it must contain) per case, where it is specific
NAMED = {
    "unknown knob": ("--set no_such_knob", "unknown knob 'no_such_knob' of the powerinfer2 strategy; its knobs: "),
    "budget in bits": ("--memory-budget", "'Gb' in '12Gb' reads as Gbit; sizes are in bytes: write GB"),
    "fraction of a byte": ("--memory-budget", "must be a whole number of bytes, got '1.5'"),
    "unknown profile field": ("--set device.storage.nope", "no field 'nope' at storage"),
    "profile field out of range": ("--set device.cpu.clusters.big.cores", ">= 1"),
    "profile field of the wrong type": ("--set model.n_layers", "integer"),
    "context beyond max_context": ("--prompt-tokens/--decode-tokens", "max_context 512"),
    "offline policy in a timed run": ("--policy", "belady"),
    "profile policy without a profile": ("--policy", "static-hot"),
    "dense with a cache policy": ("--policy", "no cache"),
    "timeline in analytic mode": ("--timeline", "analytic"),
    "timeline to a folder": ("--timeline", ""),
    "gantt with an unknown format": ("--gantt", ".png"),
    "tokens csv where nothing can be written": ("--tokens-csv", "cannot write"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(files, capsys, case):
    options = dict(BAD[case])
    if options.get("--trace") == "OTHER":
        options["--trace"] = files["other_trace"]
    elif options.get("--trace") == "MISSING":
        options["--trace"] = str(Path(files["dir"]) / "missing.npz")
    options = {k: v.replace("OUT", files["dir"]) if v else v for k, v in options.items()}
    assert main([*argv(files, **options), "--json"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in captured.err and captured.out == ""
    if case in NAMED:
        flag, text = NAMED[case]
        assert f"{flag}: " in err and text in err, err


def test_outputs_are_checked_before_the_run(files, tmp_path, capsys, monkeypatch):
    """A bad output path fails before simulating, so no finished run is thrown away."""
    import sim.engine.simulation as simulation

    def must_not_run(*args, **kwargs):
        raise AssertionError("simulated before checking the outputs")

    monkeypatch.setattr(simulation, "simulate", must_not_run)
    assert main([*argv(files), "--gantt", "/proc/no/g.png", "--json"]) == 2
    assert "--gantt: cannot write" in capsys.readouterr().err


def test_set_on_a_profile_field_is_the_edited_profile_file(files, tmp_path, capsys):
    """`--set device.<path>=value` runs exactly what a device file with that edit runs."""
    from sim.profiles.registry import load_device

    edited = load_device("oneplus-12").model_dump(mode="json")
    for point in edited["storage"]["rand_read"]:
        point["gbps"] *= 0.25
    edited["cpu"]["clusters"][0]["cores"] = 2
    device_file = h.write_yaml(tmp_path / "slow-flash.yaml", edited)
    sets = ["--set", "device.storage.rand_read.*.gbps:scale=0.25", "--set", "device.cpu.clusters.big.cores=2"]
    assert main([*argv(files), *sets, "--json"]) == 0
    with_sets = json.loads(capsys.readouterr().out)
    assert main([*argv(files, **{"--device": str(device_file)}), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main([*argv(files), "--json"]) == 0
    unchanged = json.loads(capsys.readouterr().out)
    for key in CONTRACT_KEYS:
        assert with_sets[key] == from_file[key], key
    assert with_sets["decode_tokens_per_s"] < unchanged["decode_tokens_per_s"]  # a quarter of the flash throughput
    assert with_sets["config"]["overrides"] == {"device.storage.rand_read.*.gbps:scale": 0.25,
                                                "device.cpu.clusters.big.cores": 2}
    assert with_sets["config"]["base_profiles"] == {"device": "oneplus-12", "model": files["model"]}
    assert unchanged["config"]["overrides"] == {}


SET_ERRORS = [
    # (the --set arguments, the field the one-line error must name, text it must contain)
    (["device.cpu.clusters.big.cores:scale=.nan"], "--set device.cpu.clusters.big.cores:scale", "finite"),
    (["device.cpu.clusters.big.cores:scale=.inf"], "--set device.cpu.clusters.big.cores:scale", "finite"),
    (["device.cpu.clusters.big.cores:scale=2.5"], "--set device.cpu.clusters.big.cores:scale", "integer, got 2.5"),
    (["cluster_neurons=" + "9" * 5000], "--set cluster_neurons", "unreadable value"),
    (["device.cpu.clusters.big.cores=3", "device.cpu.clusters.big.cores=5"], "--set device.cpu.clusters.big.cores",
     "given twice"),
    (["model.sparsity.mean_active_fraction=0.9"], "--set model.sparsity.mean_active_fraction",
     "not read by the simulation"),
    (["device.storage.queue_depth=0"], "--set device.storage.queue_depth", ">= 1"),
    (["device.storage.range_effect=[]", "device.storage.range_effect.*.factor:scale=0.1"],
     "--set device.storage.range_effect.*.factor:scale", "matches no entry"),
    (["device.cpu.clusters.big.cores=0", "device.cpu.clusters.little.cores=2"], "--set device.cpu.clusters.big.cores",
     ">= 1"),
    (["device.dram.usable_bytes=30GB", "device.dram.peak_gbps=80"], "--set device.dram.usable_bytes",
     "must not exceed total_bytes"),
    (["device.cpu.mem_gbps=100", "device.npu=null"], "--set device.cpu.mem_gbps", "exceeds dram.peak_gbps"),
    (["device.dram={total_bytes: 24GB, usable_bytes: 19GB, peak_gbps: 76.8}"], "--set device.dram",
     "combined_gbps: required field is missing"),
    (["device.storage.page_bytes=0.4"], "--set device.storage.page_bytes", "at least 1 byte"),
    (["device.cpu.clusters.little.name='0'"], "--set device.cpu.clusters.little.name", "pattern"),
    (["knobs.device.name=x"], "--set knobs.device.name", "no dots"),
    (["compute_cores=[]"], "--set", "names no core"),
    (["hot_share=.nan"], "--set hot_share", "finite"),
    (["compute_cores=[big,big]"], "--set compute_cores", "puts 2 compute threads on big, which has 1 core"),
    (["device.storage.read_latency_us=100", "device.storage.read_latency_us:scale=0.015"],
     "--set device.storage.read_latency_us:scale", "which device.storage.read_latency_us changes too"),
    (["device.cpu.clusters.big.cores=3", "device.cpu.clusters.0.cores=2"], "--set device.cpu.clusters.0.cores",
     "changes cpu.clusters.0.cores, which device.cpu.clusters.big.cores changes too"),
    (["device.storage.range_effect.*.factor=0.9", "device.storage.range_effect=[]"],
     "--set device.storage.range_effect", "give one edit per field"),
    (["cluster_neurons='256'"], "--set cluster_neurons", "must be an integer, got '256'"),
    (["cluster_neurons=256.0"], "--set cluster_neurons", "must be an integer, got 256.0"),
    (["split_gate_read=1"], "--set split_gate_read", "must be a bool, got 1"),
]


def test_knobs_are_strict_but_take_numpy_numbers():
    """As profiles: a string or a float is not an integer knob; numpy scalars are the numbers they are."""
    import numpy as np

    from sim.engine.simulation import check_options

    setup = check_options(knobs={"cluster_neurons": np.int64(256), "hot_share": np.float32(0.25),
                                 "compute_cores": list(np.array(["big", "mid-hi"]))})
    assert setup.knobs.cluster_neurons == 256 and type(setup.knobs.cluster_neurons) is int
    assert setup.knobs.hot_share == 0.25 and setup.knobs.compute_cores == ["big", "mid-hi"]


@pytest.mark.parametrize(("sets", "field", "text"), SET_ERRORS, ids=[" ".join(c[0])[:60] for c in SET_ERRORS])
def test_set_errors_name_the_edit_to_blame(files, capsys, sets, field, text):
    args = [a for item in sets for a in ("--set", item)]
    assert main([*argv(files), *args, "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}: ") and "\n" not in err and text in err, err


def test_set_echoes_the_edit_as_typed(files, capsys):
    curve = "[{span: 128MiB, factor: 1.0}, {span: 512MiB, factor: 0.9}]"  # brackets are not Rich markup here
    assert main([*argv(files), "--set", "device.cpu.clusters.big.io_4k_gbps=1.076",
                 "--set", f"device.storage.range_effect={curve}"]) == 0
    out = capsys.readouterr().out
    assert f"with --set device.storage.range_effect={curve}" in out
    assert "with --set device.cpu.clusters.big.io_4k_gbps=1.076" in out


def test_a_knob_may_be_spelled_as_in_a_sweep_spec(files, capsys):
    assert main([*argv(files), "--set", "knobs.cluster_neurons=64", "--json"]) == 0
    spelled = json.loads(capsys.readouterr().out)
    assert main([*argv(files), "--set", "cluster_neurons=64", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert spelled["config"]["knobs"]["cluster_neurons"] == 64
    assert spelled["decode_tokens_per_s"] == plain["decode_tokens_per_s"]


def _plan(path: Path, **fields) -> str:
    data = {"strategy": "powerinfer2", "device": "oneplus-12", "model": "tiny-moe", "memory_budget": "1GB",
            "knobs": {"cluster_neurons": 64}}
    data.update(fields)
    return str(h.write_yaml(path, data))


def test_plan_knobs_apply_and_a_mismatch_is_a_warning(files, tmp_path, capsys):
    plan = _plan(tmp_path / "plan.yaml")
    assert main([*argv(files), "--plan", plan, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("planned for" in w and "memory_budget 1GB" in w for w in out["warnings"]), out["warnings"]
    assert not any("device oneplus-12" in w for w in out["warnings"])
    assert main([*argv(files), "--plan", plan, "--set", "device.cpu.clusters.big.cores=2", "--json"]) == 0
    edited = json.loads(capsys.readouterr().out)  # a plan made for the unedited phone says so
    assert any("device oneplus-12 (this run: oneplus-12 with --set device.cpu.clusters.big.cores=2)" in w
               for w in edited["warnings"]), edited["warnings"]
    assert main([*argv(files), "--set", "cluster_neurons=64", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert out["decode_tokens_per_s"] == same["decode_tokens_per_s"]  # the plan's knob was applied


@pytest.mark.parametrize(("fields", "field", "text"), [
    ({"knobs": 5}, "knobs", "mapping"),
    ({"knobs": {"hot_share": 2.5}}, "knobs: hot_share", "<= 1"),
    ({"strategy": "llamacpp"}, "strategy", "--strategy llamacpp"),
])
def test_bad_plan_names_the_plan_file(files, tmp_path, capsys, fields, field, text):
    plan = _plan(tmp_path / "plan.yaml", **fields)
    assert main([*argv(files), "--plan", plan, "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {plan}: {field}: ") and text in err, err


def test_trace_of_another_model_with_the_same_shape_warns(files, tmp_path, capsys):
    twin = h.write_yaml(tmp_path / "twin.yaml", {**h.TINY_MOE, "name": "tiny-moe-twin"})
    assert main([*argv(files, **{"--model": str(twin)}), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any("trace is of tiny-moe" in w and "tiny-moe-twin" in w for w in warnings), warnings
    assert main([*argv(files), "--json"]) == 0
    assert not any("trace is of" in w for w in json.loads(capsys.readouterr().out)["warnings"])


def test_energy_counts_dram_traffic_at_the_profiles_rate(files):
    """energy = busy x active power + idle power + DRAM bytes x dram_w_per_gbps (J per GB)."""
    import sim

    kw = dict(trace=files["trace"], decode_tokens=6, warmup_tokens=4, prompt_tokens=8, offload=0.5)
    with_dram = simulate("oneplus-12", files["model"], **kw).summary
    no_dram = simulate(sim.edit_device("oneplus-12", {"power.dram_w_per_gbps": 0.0}), files["model"], **kw).summary
    rate = sim.load_device("oneplus-12").power.dram_w_per_gbps
    assert with_dram["dram_bytes_per_token"] > 0
    assert with_dram["energy_j_per_token"] - no_dram["energy_j_per_token"] == pytest.approx(
        rate * with_dram["dram_bytes_per_token"] / 1e9, rel=1e-9)
    assert "dram_bytes_per_token" not in simulate("oneplus-12", files["model"], mode="analytic", **kw).summary
