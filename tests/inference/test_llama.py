"""The numpy Llama decoder on the real SmolLM2-135M GGUF file (skipped when it is not fetched).

One model is loaded per session (the ``smollm2`` fixture in conftest.py); each test runs at
most a few dozen decode steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import SimError
from sim.inference.fetch import smollm2_cached
from sim.inference.llama import resolve_gguf
from sim.inference.sparsify import calibrate

needs_model = pytest.mark.skipif(not smollm2_cached(),
                                 reason="SmolLM2-135M is not fetched: run `python -m sim.inference.fetch smollm2`")


def test_missing_model_names_the_fetch_command(tmp_path):
    with pytest.raises(SimError, match=r"python -m sim\.inference\.fetch smollm2") as err:
        resolve_gguf("smollm2-135m", tmp_path)
    assert "\n" not in str(err.value)
    with pytest.raises(SimError, match="unknown model"):
        resolve_gguf("gpt-5", tmp_path)


@needs_model
def test_capital_of_france_is_paris(smollm2):
    gen = smollm2.generate("The capital of France is", 4)
    assert gen.text.strip().startswith("Paris")
    assert gen.density == 1.0


@needs_model
def test_tokenizer_round_trips_text(smollm2, corpus):
    text = corpus.read_text(encoding="utf-8")[:2000]
    ids = smollm2.tok.encode(text)
    assert smollm2.tok.decode(ids) == text
    assert ids.size < len(text) / 2  # merges happened: English is ~4 characters a token


@needs_model
def test_sparse_decode_is_dense_at_density_one_and_realises_its_target(smollm2, corpus):
    ids = smollm2.tok.encode(corpus.read_text(encoding="utf-8"))[:192]
    full = calibrate(smollm2.net, ids, 1.0)
    dense = smollm2.generate("It is a truth universally acknowledged", 6)
    same = smollm2.generate("It is a truth universally acknowledged", 6, active=full)
    assert same.ids.tolist() == dense.ids.tolist() and same.density == 1.0
    half = calibrate(smollm2.net, ids, 0.5)
    assert np.all(half.thresholds > 0)
    # on the calibration text itself every layer keeps the target share (quantile), up to ties
    masks = []
    smollm2.net.forward(ids[:64], active=lambda layer, x, e: masks.append(half(layer, x, e)) or masks[-1])
    realised = np.mean([m.mean() for m in masks])
    assert 0.4 < realised < 0.6
    sparse = smollm2.generate("It is a truth universally acknowledged", 6, active=half)
    assert 0.3 < sparse.density < 0.7


@needs_model
def test_sampling_is_seeded(smollm2):
    a = smollm2.generate("Once upon a time", 5, temperature=0.8, top_k=40, rng=np.random.default_rng(3))
    b = smollm2.generate("Once upon a time", 5, temperature=0.8, top_k=40, rng=np.random.default_rng(3))
    assert a.ids.tolist() == b.ids.tolist()
    with pytest.raises(SimError, match="rng"):
        smollm2.generate("Once upon a time", 2, temperature=0.8)


def test_infer_cli_rejects_bad_flags_in_one_line(capsys, tmp_path):
    from sim.cli import main

    assert main(["infer", "--prompt", "Hi", "--density", "0"]) == 2
    assert main(["infer", "--prompt", "Hi", "--tokens", "0"]) == 2
    assert main(["infer", "--prompt", "Hi", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "--density" in err[0] and "--tokens" in err[1] and "fetch smollm2" in err[2]


def test_record_density_is_checked_in_one_line(capsys, tmp_path):
    from sim.cli import main

    text = tmp_path / "t.txt"
    text.write_text("Some text.", encoding="utf-8")
    common = ["trace", "record", "--text", str(text), "--tokens", "2", "--out", str(tmp_path / "t.npz")]
    assert main([*common, "--model", "smollm2-135m", "--other-text", str(text), "--record-density", "1.5"]) == 2
    assert main([*common, "--model", "some-encoder", "--record-density", "0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: --record-density: ") for line in err)
    assert "(0, 1]" in err[0] and "decoder" in err[1]


@needs_model
def test_infer_cli_json_has_the_contracted_keys(capsys, monkeypatch, smollm2):
    import json

    import sim.inference.llama as llama
    from sim.cli import main

    monkeypatch.setattr(llama, "load_llama", lambda *a, **k: smollm2)  # the session's model: no second load
    assert main(["infer", "--model", "smollm2-135m", "--prompt", "The capital of France is", "--tokens", "3",
                 "--density", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"text", "tokens", "density", "tokens_per_s"} <= set(out)
    assert out["tokens"] == 3 and 0 < out["density"] < 1 and out["tokens_per_s"] > 0


def test_a_record_sparsity_is_what_is_kept_while_the_ffn_computes_its_own():
    from sim.inference.decode_trace import _Recorder

    compute = lambda layer, x, e: (x[:, None, :] > 0.2)  # noqa: E731  (toy thresholds on a toy "gate")
    stricter = lambda layer, x, e: (x[:, None, :] > 0.7)  # noqa: E731
    rec = _Recorder(compute, n_layers=1, n_neurons=8, record=stricter)
    x = np.random.default_rng(0).random((5, 8))
    assert (rec(0, x, None) == compute(0, x, None)).all()  # the FFN computes its own set
    _, kept = rec.arrays()
    assert (kept[0] == (x > 0.7)).all() and kept[0].sum() < (x > 0.2).sum()


@needs_model
def test_a_sparser_record_density_records_that_density_along_the_decode(smollm2, corpus, tmp_path):
    from sim.inference.decode_trace import record_decode_trace
    from sim.traces.format import Trace

    trace = Trace.load(record_decode_trace(
        smollm2, tmp_path / "t.npz", prompt_text=corpus, other_text=corpus.parent / "tale_of_two_cities_ch1.txt",
        prompt_tokens=4, decode_tokens=2, density=0.5, record_density=0.15, calib_tokens=32, train_tokens=16,
        rank=4))
    extra = trace.meta.extra
    assert extra["record_density"] == 0.15 and extra["target_density"] == 0.5
    assert np.all(np.asarray(extra["record_thresholds"]) > np.asarray(extra["thresholds"]))
    assert np.mean(extra["density_per_layer"]) < 0.6 * extra["decode_density"]
