"""Inputs a hostile new user tried (issue 18): each fails in one line with status 2, leaves
its inputs alone, or gives a correct answer; never a traceback or a silently wrong figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cache_helpers import toy_trace

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
    plain = toy_trace().save(tmp_path / "plain.npz")
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

    plain = synth_trace("llama-2-7b", "llama-2-7b", 6).save(tmp_path / "plain.npz")
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
