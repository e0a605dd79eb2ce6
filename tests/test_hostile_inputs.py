"""Inputs a hostile new user tried (issue 18): each fails in one line with status 2, leaves
its inputs alone, or gives a correct answer; never a traceback or a silently wrong figure."""

from __future__ import annotations

import pytest

from sim.cli import main


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
