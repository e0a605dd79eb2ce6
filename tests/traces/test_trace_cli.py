"""`sim trace ...` end to end through sim.cli.main."""

from __future__ import annotations

import json

import numpy as np
import yaml

from sim.cli import main
from sim.traces.format import Trace


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_synth_info_stats_compare_fit(tmp_path, capsys):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    code, out, _ = _run(capsys, "trace", "synth", "--model", "llama-2-7b", "--tokens", "24", "--seed", "4",
                        "--out", str(a))
    assert code == 0 and "realised mean" in out
    trace = Trace.load(a)
    assert (trace.meta.n_layers, trace.meta.n_neurons, trace.meta.n_tokens) == (32, 11008, 24)
    assert trace.meta.has_predictions and trace.meta.source == "synthetic" and trace.meta.seed == 4
    code, out, _ = _run(capsys, "trace", "info", str(a))
    assert code == 0 and "11008" in out
    recall = sum(trace.meta.predictor["recall"]) / 32
    assert f"synthetic, recall {recall:.3f}, " in out  # the means, not JSON cut at 200 characters
    code, out, _ = _run(capsys, "trace", "stats", str(a), "--json", "--plot", str(tmp_path / "s.png"))
    stats = json.loads(out)
    assert code == 0 and (tmp_path / "s.png").stat().st_size > 1000
    assert len(stats["density"]) == 32 and set(stats["window_new_share"]) == {str(k) for k in range(11)}
    assert set(stats["popularity"]) == {"1", "5", "10", "20", "50"}
    params = tmp_path / "p.yaml"
    code, out, _ = _run(capsys, "trace", "fit", str(a), "-o", str(params))
    assert code == 0 and yaml.safe_load(params.read_text())["made_for"]["n_neurons"] == 11008
    code, _, _ = _run(capsys, "trace", "synth", "--model", "opt-6.7b", "--params", str(params), "--tokens", "12",
                      "--seed", "1", "--out", str(b), "--no-predictions")
    assert code == 0 and Trace.load(b).meta.n_neurons == 16384 and not Trace.load(b).meta.has_predictions
    code, out, _ = _run(capsys, "trace", "compare", str(a), str(b))
    assert code == 0 and "window_new_share k=5" in out and "B/A-1" in out


def test_same_seed_same_file_contents(tmp_path, capsys):
    paths = [tmp_path / "x.npz", tmp_path / "y.npz"]
    for p in paths:
        assert main(["trace", "synth", "--model", "turbosparse-mixtral-47b", "--tokens", "3", "--seed", "9",
                     "--out", str(p)]) == 0
    x, y = (list(Trace.load(p).chunks()) for p in paths)
    assert all(np.array_equal(c.ids, d.ids) and np.array_equal(c.experts, d.experts) for c, d in zip(x, y,
                                                                                                     strict=True))


def test_user_errors_are_one_line(tmp_path, capsys):
    cases = [
        ["trace", "synth", "--model", "llama-2-7b", "--preset", "nope", "--tokens", "2", "--out",
         str(tmp_path / "o.npz")],
        ["trace", "synth", "--model", "llama-2-7b", "--tokens", "2", "--out", str(tmp_path / "o")],  # no .npz
        ["trace", "synth", "--model", "llama-2-7b", "--tokens", "0", "--out", str(tmp_path / "o.npz")],
        ["trace", "synth", "--model", "no-such-model", "--preset", "opt-6.7b", "--tokens", "2",
         "--out", str(tmp_path / "o.npz")],
        ["trace", "synth", "--model", "llama-2-7b", "--params", str(tmp_path / "missing.yaml"), "--tokens", "2",
         "--out", str(tmp_path / "o.npz")],
        ["trace", "stats", str(tmp_path / "missing.npz")],
        ["trace", "synth", "--model", "llama-2-7b", "--tokens", "2", "--seed", "-1", "--out", str(tmp_path / "o.npz")],
        ["trace", "record", "--model", "all-minilm-l6-v2", "--text", str(tmp_path / "none.txt"), "--tokens", "5",
         "--out", str(tmp_path / "r.npz")],
    ]
    for argv in cases:
        code, _, err = _run(capsys, *argv)
        assert code == 2, argv
        assert err.startswith("error: ") and err.count("\n") == 1, err
