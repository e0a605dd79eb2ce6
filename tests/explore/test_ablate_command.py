"""`sim ablate`: sim run's options plus a ladder; [PI2] §7.5's ladder on the OnePlus 12.

The Bamboo-7B ladder runs once (module fixture, 8 decode tokens a rung, a few seconds);
the other runs use the tiny MoE model on the Mixtral preset.
"""

from __future__ import annotations

import itertools
import json

import explore_helpers as eh
import pytest
import typer

from sim.cli import app, main
from sim.commands.run import OUTPUT_FLAGS

PNG = b"\x89PNG\r\n\x1a\n"


def _params(command: str) -> dict:
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


def test_ablate_takes_every_run_option_of_sim_run_as_sim_run_declares_it():
    run, ablate = _params("run"), _params("ablate")
    assert set(ablate) == set(run) - set(OUTPUT_FLAGS) | {"ladder", "json_out", "plot"}
    for name in set(run) - set(OUTPUT_FLAGS):
        a, r = ablate[name], run[name]
        assert (a.opts, a.default, a.help, a.multiple) == (r.opts, r.default, r.help, r.multiple), name


@pytest.fixture(scope="module")
def bamboo_ladder():
    """`sim ablate --model bamboo-7b --offload 0.5 --calibration none` on the OnePlus 12 (the default
    device), as JSON rows: the bamboo-7b preset's own skew, which gives §7.5's 95% (the calibration's
    one skew for the 7B family does not: pi2-bamboo-ablation-cache-hit's known_gap says why)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ablate", "--model", "bamboo-7b", "--offload", "0.5", "--decode-tokens", "8",
                     "--warmup-tokens", "8", "--calibration", "none", "--json"]) == 0
    return json.loads(out.getvalue())


def test_the_bamboo_ladder_adds_pi2s_mechanisms_and_the_cache_rung_hits_95_percent(bamboo_ladder):
    rows = bamboo_ladder
    assert [r["rung"] for r in rows] == ["baseline", "+bundle", "+neuron_cache", "+pipeline", "+xpu"]
    assert rows[0]["knobs"] == {"bundle": False, "neuron_cache": False, "pipeline": False, "xpu": False}
    cache = rows[2]
    assert abs(cache["cache_hit_ratio"] - 0.95) <= 0.03  # [PI2] §7.5: a 95% hit rate after the neuron cache
    assert rows[1]["cache_hit_ratio"] < cache["cache_hit_ratio"] - 0.03  # the static set hits less
    for before, after in itertools.pairwise(rows):
        assert after["decode_tokens_per_s"] >= before["decode_tokens_per_s"], after["rung"]
        assert after["speedup"] == pytest.approx(after["decode_tokens_per_s"] / before["decode_tokens_per_s"])


def test_the_table_names_each_rung_its_speed_up_and_bottleneck_and_the_plot_has_a_bar_each(tmp_path, capsys):
    model = eh.write_model(tmp_path)
    plot = tmp_path / "ladder.png"
    assert main(["ablate", "--model", str(model), "--preset", eh.PRESET, "--offload", "0.8", "--decode-tokens", "4",
                 "--warmup-tokens", "4", "--ladder", "bundle,pipeline", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    for text in ("baseline", "+bundle", "+pipeline", "speed-up", "1.00x", "busiest"):
        assert text in out
    assert plot.read_bytes().startswith(PNG)


@pytest.mark.parametrize(("argv", "message"), [
    (["--ladder", "bundle,warp"], "error: --ladder: unknown mechanism 'warp'; powerinfer2's mechanisms: bundle, "),
    (["--ladder", "xpu", "--set", "xpu=false"], "error: --set xpu: the ladder switches xpu"),
    (["--strategy", "dense"], "error: --strategy: the dense strategy has no mechanisms to switch"),
    (["--plot", "ladder.txt"], "error: ladder.txt: --plot: unsupported extension '.txt'"),
    (["--decode-tokens", "0"], "error: --decode-tokens: "),
])
def test_bad_options_are_one_line_naming_the_flag_before_anything_runs(tmp_path, capsys, monkeypatch, argv, message):
    import sim.engine.simulation as simulation

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(simulation, "simulate", lambda *a, **k: pytest.fail("ran before refusing"))
    assert main(["ablate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not list(tmp_path.iterdir())
