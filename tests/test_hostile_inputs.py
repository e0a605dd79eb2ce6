"""Inputs a hostile new user tried (issue 18): each fails in one line with status 2, leaves
its inputs alone, or gives a correct answer; never a traceback or a silently wrong figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cache_helpers import toy_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.errors import SimError


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.strip()


# 1. control characters in any YAML the CLI reads

CONTROL = ["\0", "\x07", "\x1b"]


@pytest.mark.parametrize("char", CONTROL)
@pytest.mark.parametrize(("argv", "text"), [
    (["profiles", "validate", "{f}"], "name: x{c}\n"),
    (["run", "--plan", "{f}"], "cluster_neurons: 1{c}28\n"),
    (["sweep", "run", "{f}", "--out", "{tmp}/r.parquet", "--dry-run"], "base: {{}}{c}\n"),
    (["trace", "synth", "--model", "llama-2-7b", "--tokens", "2", "--params", "{f}", "--out", "{tmp}/t.npz"],
     "# fit{c}\nsparsity: 0.5\n"),
])
def test_a_control_character_in_a_yaml_file_is_one_line_naming_file_and_place(tmp_path, capsys, char, argv, text):
    path = tmp_path / "in.yaml"
    path.write_text(text.format(c=char))
    assert main([a.format(f=path, tmp=tmp_path) for a in argv]) == 2
    err = _one_line_error(capsys)
    assert f"{path}: line " in err and f"control character U+{ord(char):04X}" in err


@pytest.mark.parametrize("char", CONTROL)
def test_a_control_character_in_a_set_value_names_the_flag(capsys, char):
    assert main(["run", "--set", f"cluster_neurons={char}"]) == 2
    err = _one_line_error(capsys)
    assert "--set cluster_neurons" in err and f"U+{ord(char):04X}" in err


# 2, 3. traces written with other integer dtypes or byte orders give the same answers

def _rewritten(tmp_path: Path, plain: Path, how: str) -> Path:
    from trace_helpers import rewrite_members

    def change(name: str, arr: np.ndarray) -> np.ndarray:
        if how == "uint64-offsets":
            return arr.astype(np.uint64) if name.endswith("offsets") else arr
        return arr.astype(arr.dtype.newbyteorder(">"))

    (tmp_path / how).mkdir()
    return rewrite_members(plain, tmp_path / how / plain.name, change)  # the same name: outputs compare equal


@pytest.mark.parametrize("how", ["uint64-offsets", "big-endian"])
@pytest.mark.parametrize("argv", [
    ["trace", "stats", "{t}"],
    ["trace", "compare", "{plain}", "{t}"],
    ["trace", "fit", "{t}", "--out", "{out}"],
    ["cache", "compare", "--trace", "{t}", "--sizes", "10%,50%"],
])
def test_trace_commands_read_any_dtype_and_byte_order(tmp_path, capsys, how, argv):
    plain = toy_trace().save(tmp_path / "plain.npz", version=1)  # version 1 stores arrays as written
    other = _rewritten(tmp_path, plain, how)
    outputs = []
    for trace in (plain, other):
        out = trace.parent / "fit.yaml"
        assert main([a.format(t=trace, plain=plain, out=out) for a in argv]) == 0
        text = capsys.readouterr().out.replace(str(trace), "T").replace(str(out), "O")
        outputs.append(out.read_text().replace(str(trace), "T") if out.exists() else text)
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("how", ["uint64-offsets", "big-endian"])
def test_a_run_reads_any_dtype_and_byte_order(tmp_path, capsys, how):
    from sim.traces.synth import synth_trace

    plain = synth_trace("llama-2-7b", "llama-2-7b", 6).save(tmp_path / "plain.npz", version=1)
    other = _rewritten(tmp_path, plain, how)
    figures = []
    for trace in (plain, other):
        assert main(["run", "--model", "llama-2-7b", "--trace", str(trace), "--prompt-tokens", "1",
                     "--decode-tokens", "2", "--warmup-tokens", "0", "--profile-tokens", "2", "--json"]) == 0
        figures.append(json.loads(capsys.readouterr().out)["decode_tokens_per_s"])
    assert figures[0] == figures[1] > 0


# 9. a trace of no tokens is refused where it would give all-zero answers

@pytest.mark.parametrize(("argv", "what"), [
    (["trace", "stats", "{t}"], "statistics"),
    (["cache", "compare", "--trace", "{t}"], "a cache comparison"),
])
def test_a_trace_of_no_tokens_is_refused(tmp_path, capsys, argv, what):
    from sim.traces.synth import synth_trace

    path = synth_trace("llama-2-7b", "llama-2-7b", 0).save(tmp_path / "empty.npz")
    assert main([a.format(t=path) for a in argv]) == 2
    assert _one_line_error(capsys) == (f"error: {path}: meta.n_tokens: trace has 0 tokens; at least 1 is needed "
                                       f"for {what}")


def test_the_api_refuses_a_trace_of_no_tokens_too():
    from sim.cache.compare import compare_trace
    from sim.traces.stats import trace_stats
    from sim.traces.synth import synth_trace

    empty = synth_trace("llama-2-7b", "llama-2-7b", 0)
    for fn in (lambda: trace_stats(empty), lambda: compare_trace(empty, "lru", "10%")):
        with pytest.raises(SimError, match="trace has 0 tokens"):
            fn()


# 6. an output that is the same file as an input is refused before anything is written

def _same_file(original: Path, spelling: str, tmp_path: Path) -> str:
    """Another way to name ``original``: as given, with ./ and .., through a symlink or a hard link."""
    if spelling == "as-given":
        return str(original)
    if spelling == "dotted":
        return str(original.parent / "." / ".." / original.parent.name / original.name)
    link = tmp_path / f"{spelling}-{original.name}"
    if spelling == "symlink":
        link.symlink_to(original)
    else:
        link.hardlink_to(original)
    return str(link)


def _inputs(tmp_path: Path) -> dict[str, Path]:
    """One input file of each kind a command reads, each renamed to the suffix its output takes."""
    from sim.profiles.registry import resolve_path

    csv = tmp_path / "requests.csv"
    csv.write_text("step,key\n0,1\n1,2\n2,1\n")
    device = tmp_path / "dev.json"
    device.write_text(resolve_path("device", "oneplus-12").read_text())  # YAML is JSON's superset: read as YAML
    plan_yaml = tmp_path / "my.yaml"
    plan_yaml.write_text(resolve_path("device", "oneplus-12").read_text())
    trace = toy_trace(n_tokens=8).save(tmp_path / "t.npz")
    fit_in = tmp_path / "fit-in.yaml"
    fit_in.write_text("x: 1\n")
    from sim.calibrate.calibration import default_path

    cal = tmp_path / "cal.yaml"
    cal.write_text(default_path().read_text(encoding="utf-8"), encoding="utf-8")
    return {"csv": csv, "device": device, "plan_yaml": plan_yaml, "trace": trace, "fit_in": fit_in, "cal": cal}


OUTPUT_IS_INPUT = [  # (argv with {in} the input, the input's key, the output flag, the input's flag)
    (["cache", "compare", "--requests", "{in}", "--out", "{out}"], "csv", "--out", "--requests"),
    (["plan", "--device", "{in}", "--memory-budget", "8GB", "--out", "{out}"], "plan_yaml", "--out", "--device"),
    (["run", "--device", "{in}", "--timeline", "{out}"], "device", "--timeline", "--device"),
    (["run", "--plan", "{in}", "--tokens-csv", "{out}"], "csv", "--tokens-csv", "--plan"),
    (["trace", "synth", "--model", "llama-2-7b", "--tokens", "2", "--params", "{in}", "--out", "{out}"], "trace",
     "--out", "--params"),
    (["trace", "fit", "{in}", "--out", "{out}"], "fit_in", "--out", "TRACE"),
    (["calibrate", "--params", "m1-pytorch-row-move-us", "--max-evals", "1", "--no-cv", "--start", "{in}",
      "--out", "{out}"], "cal", "--out", "--start"),
]


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal must come before any simulation, search or replay."""
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("work started before the output was checked")

    import sim.cache.compare
    import sim.calibrate.calibration
    import sim.engine.simulation
    import sim.explore.planner
    import sim.traces.fit
    import sim.traces.synth

    monkeypatch.setattr(sim.engine.simulation, "simulate", forbidden)
    monkeypatch.setattr(sim.explore.planner, "plan", forbidden)
    monkeypatch.setattr(sim.cache.compare, "compare_requests", forbidden)
    monkeypatch.setattr(sim.traces.fit, "fit_params", forbidden)
    monkeypatch.setattr(sim.traces.synth, "write_synthetic", forbidden)
    monkeypatch.setattr(sim.calibrate.calibration, "calibrate", forbidden)


@pytest.mark.parametrize("spelling", ["as-given", "dotted", "symlink", "hardlink"])
@pytest.mark.parametrize(("argv", "key", "flag", "in_flag"), OUTPUT_IS_INPUT,
                         ids=[" ".join(c[0][:2]) + " " + c[2] for c in OUTPUT_IS_INPUT])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, capsys, nothing_runs, spelling, argv,
                                                                 key, flag, in_flag):
    inputs = _inputs(tmp_path)
    if key == "fit_in":  # trace fit's input is the trace; its output is YAML: the trace, renamed .yaml
        inputs["fit_in"].write_bytes(inputs["trace"].read_bytes())
    if key == "trace":  # synth's --params given the output trace itself (the .npz)
        argv = [a if a != "{in}" else "{out}" for a in argv]
    original = inputs[key]
    before = original.read_bytes()
    out = _same_file(original, spelling, tmp_path)
    assert main([a.format(**{"in": original, "out": out}) for a in argv]) == 2
    err = _one_line_error(capsys)
    assert f": {flag}: is the same file as the {in_flag} input" in err, err
    assert original.read_bytes() == before


@pytest.mark.parametrize("which", ["unknowns registry", "published points"])
def test_a_calibration_written_over_the_files_the_fit_reads_is_refused(tmp_path, capsys, monkeypatch, nothing_runs,
                                                                       which):
    """sim calibrate reads the unknowns' registry and the published points (in an editable
    install, files of the user's checkout): --out naming either is refused, the file kept."""
    import sim.calibrate.unknowns
    import sim.validation

    registry, published = tmp_path / "unknowns.yaml", tmp_path / "published.yaml"
    registry.write_text(sim.calibrate.unknowns.registry_path().read_text(encoding="utf-8"), encoding="utf-8")
    published.write_text(Path(sim.validation.published_path()).read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(sim.calibrate.unknowns, "registry_path", lambda: registry)
    monkeypatch.setattr(sim.validation, "published_path", lambda: str(published))
    target = registry if which == "unknowns registry" else published
    before = target.read_bytes()
    assert main(["calibrate", "--params", "m1-pytorch-row-move-us", "--max-evals", "1", "--no-cv",
                 "--out", str(target)]) == 2
    assert f": --out: is the same file as the {which} input" in _one_line_error(capsys)
    assert target.read_bytes() == before


@st.composite
def spellings_of(draw, folder: Path, name: str) -> str:
    """A path naming ``folder / name`` with any mix of ./ and sub/.. segments (sub exists)."""
    parts = [str(folder)]
    for _ in range(draw(st.integers(0, 4))):
        parts.append(draw(st.sampled_from([".", "sub/..", "sub/./.."])))
    return "/".join([*parts, name])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n_links=st.integers(0, 3), other_inputs=st.lists(st.sampled_from(["oneplus-12", None, "x"]),
                                                                         max_size=3))
def test_any_spelling_of_an_input_is_refused_as_an_output(tmp_path_factory, data, n_links, other_inputs):
    """Fuzz output-equals-input: however the output names an input (./, .., a chain of symlinks),
    check_output refuses it and leaves the input's bytes alone; a different file passes."""
    from sim.outputs import check_output

    folder = tmp_path_factory.mktemp("io")
    (folder / "sub").mkdir()
    original = folder / "in.csv"
    original.write_text("step,key\n0,1\n")
    target = original
    for i in range(n_links):
        link = folder / f"link{i}.csv"
        link.symlink_to(target)
        target = link
    spelled = data.draw(spellings_of(folder, target.name))
    inputs = {f"--other{i}": v for i, v in enumerate(other_inputs)} | {"--requests": str(original)}
    with pytest.raises(SimError, match="is the same file as the --requests input") as info:
        check_output(Path(spelled), "--out", suffixes=(".csv",), inputs=inputs)
    assert info.value.field == "--out" and "\n" not in str(info.value)
    assert original.read_text() == "step,key\n0,1\n"
    check_output(folder / "other.csv", "--out", suffixes=(".csv",), inputs=inputs)  # a new file is fine


# 13. power figures: a typo is refused, the largest allowed figures still give a finite energy

@pytest.mark.parametrize("field", ["device.power.dram_w_per_gbps", "device.power.idle_w",
                                   "device.cpu.clusters.big.active_w", "device.storage.active_w"])
def test_an_absurd_power_figure_is_refused_not_printed_as_inf(capsys, field):
    assert main(["run", "--set", f"{field}=1e308", "--decode-tokens", "2"]) == 2
    assert f"--set {field}: must be <= " in _one_line_error(capsys)


def test_the_largest_allowed_power_figures_give_a_finite_energy():
    import math

    from engine_helpers import TINY_DENSE, device_data, model, trace

    from sim.engine.simulation import simulate
    from sim.profiles.device import DeviceProfile, PowerProfile

    data = device_data()
    data["power"] = {"idle_w": PowerProfile.model_fields["idle_w"].metadata[-1].le,
                     "dram_w_per_gbps": PowerProfile.model_fields["dram_w_per_gbps"].metadata[-1].le}
    for cluster in data["cpu"]["clusters"]:
        cluster["active_w"] = 1000
    tiny = model(TINY_DENSE)
    result = simulate(device=DeviceProfile.model_validate(data), model=tiny, trace=trace(tiny, 12), prompt_tokens=2,
                      decode_tokens=2, warmup_tokens=0, profile_tokens=4)
    energy = result.summary["energy_j_per_token"]
    assert math.isfinite(energy) and energy > 0


# 12. one KV-cache rule for `sim memory` and `sim run`, printed by both

def test_memory_and_run_size_the_kv_cache_alike_by_default(capsys):
    """At 7 GB `sim memory` showed a 0.393 GB neuron cache (a 512-token KV cache) and `sim run`
    0.435 GB (its 192 tokens)."""
    import sim
    from sim.engine.config import RunConfig
    from sim.profiles.memory import RUN_CONTEXT_TOKENS

    defaults = RunConfig.defaults()
    assert defaults["prompt_tokens"] + defaults["decode_tokens"] == RUN_CONTEXT_TOKENS
    assert main(["memory", "--memory-budget", "7GB", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    run_plan = sim.check_options("oneplus-12", memory_budget="7GB").plan
    assert shown["neuron_cache_bytes"] == run_plan.neuron_cache_bytes
    assert main(["memory", "--memory-budget", "7GB"]) == 0
    assert f"KV cache for {RUN_CONTEXT_TOKENS} tokens" in " ".join(capsys.readouterr().out.split())


# 14. the Python API: wrong types and huge integers are SimErrors

def test_the_api_refuses_huge_integers_and_wrong_types_in_one_line():
    import sim
    from sim.profiles.memory import plan_memory
    from sim.traces.format import Trace

    cases = [(lambda: sim.simulate(memory_budget=10**400), "--memory-budget"),
             (lambda: plan_memory("turbosparse-mixtral-47b", "oneplus-12", budget=10**400), "--memory-budget"),
             (lambda: Trace.load(123), "path"),
             (lambda: sim.validate(123), "ids")]
    for call, field in cases:
        with pytest.raises(SimError) as info:
            call()
        assert info.value.field == field and "\n" not in str(info.value)


# 15. a --tokens-csv that cannot be written (a full disk) keeps the results and names the flag and file

RUN_FAST = ["run", "--mode", "analytic", "--model", "llama-2-7b", "--prompt-tokens", "2", "--decode-tokens", "2",
            "--warmup-tokens", "0"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("json_out", [True, False])
def test_a_tokens_csv_on_a_full_disk_keeps_the_results_and_names_flag_and_file(tmp_path, capsys, json_out):
    full = tmp_path / "tokens.csv"
    full.symlink_to("/dev/full")  # opens for writing (the up-front check passes), every write fails
    assert main([*RUN_FAST, "--tokens-csv", str(full), *(["--json"] if json_out else [])]) == 2
    out, err = capsys.readouterr()
    if json_out:
        assert json.loads(out)["decode_tokens_per_s"] > 0
    else:
        assert "decode_tokens_per_s" in out
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert f"{full}: --tokens-csv: " in err and "No space left on device" in err


# 16. messages that say what is wrong, naming each flag once

@pytest.mark.parametrize(("argv", "expected"), [
    (["profiles", "show", "./nope.yaml"], "./nope.yaml: NAME: no such file"),
    (["profiles", "show", "{tmp}/"], "is a folder"),
    (["sweep", "run", "{tmp}/spec.yaml", "--out", "{tmp}/r.parquet", "--commit-every", "inf"],
     "--commit-every: must be finite"),
    (["run", "--offload", "abc"], "--offload: Input should be a valid number"),
    (["run", "--tokens-csv", "{tmp}/file/t.csv"],
     "{tmp}/file/t.csv: --tokens-csv: cannot write: {tmp}/file is not a folder"),
    (["run", "--timeline", "{tmp}/file/a/b.json"], "--timeline: cannot write: {tmp}/file is not a folder"),
    (["trace", "record", "--model", "llama-2-7b", "--text", "{tmp}", "--tokens", "2", "--out", "{tmp}/t.npz"],
     "{tmp}: --text: is a folder"),
    (["trace", "record", "--model", "smollm2-135m", "--text", "{tmp}", "--other-text", "{tmp}/file", "--tokens", "2",
      "--out", "{tmp}/t.npz"], "{tmp}: --text: is a folder"),
    (["run", "--memory-budget", "1e30GB"], "--memory-budget: 1e+30 GB exceeds"),
])
def test_messages_say_what_is_wrong(tmp_path, capsys, argv, expected):
    (tmp_path / "file").write_text("a file\n")
    (tmp_path / "spec.yaml").write_text("base: {}\n")
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = _one_line_error(capsys)
    assert expected.format(tmp=tmp_path) in err
    for flag in (a for a in argv if a.startswith("--") and a in expected):
        assert err.count(flag) == 1, err  # each flag named once
    assert "Invalid value for" not in err and "File exists" not in err and "unknown profile" not in err


# 17. notebook 03 finds its trace from any working folder, or says where it looked

def _notebook_setup_cell() -> str:
    notebook = json.loads((Path(__file__).parents[1] / "notebooks" / "03_cache_policies.ipynb").read_text())
    code = next("".join(c["source"]) for c in notebook["cells"] if "ROOT =" in "".join(c["source"]))
    return "\n".join(line for line in code.splitlines() if not line.startswith("%"))


def test_notebook_03_finds_the_trace_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(_notebook_setup_cell(), namespace)
    assert (namespace["ROOT"] / "traces" / "minilm-l6-v2.npz").is_file()


def test_notebook_03_without_a_checkout_says_where_it_looked(tmp_path, monkeypatch):
    import sim

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sim, "__file__", str(tmp_path / "site-packages" / "sim" / "__init__.py"))
    with pytest.raises(FileNotFoundError, match=r"minilm-l6-v2\.npz is not in .*checkout of the phonesim repository"):
        exec(_notebook_setup_cell(), {})


@pytest.mark.parametrize("calibration", ["bundled", "none"])
def test_an_unknown_preset_names_the_flag_with_or_without_a_calibration(capsys, calibration):
    """The bundled calibration edits the model's preset; a --preset that does not exist is the
    same one-line error either way (it read `run: preset: has no trace preset to calibrate`)."""
    argv = ["run", "--preset", "nosuch", "--decode-tokens", "4"]
    assert main([*argv, *(["--calibration", "none"] if calibration == "none" else [])]) == 2
    assert _one_line_error(capsys).startswith("error: --preset: no synthetic-trace preset 'nosuch'; presets: ")


def test_sim_memory_blames_the_dense_strategy_as_sim_run_does(capsys):
    """A dense Mixtral does not fit: the error names --strategy (the user gave no --offload)."""
    for argv in (["memory", "--strategy", "dense"], ["run", "--strategy", "dense", "--decode-tokens", "4"]):
        assert main(argv) == 2
        assert _one_line_error(capsys).startswith("error: --strategy: the dense strategy keeps every weight in DRAM")
