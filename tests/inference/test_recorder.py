"""Recording traces from tiny random models (and the real one when cached)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import SimError
from sim.inference.recorder import record_trace
from sim.inference.tokenizer import ByteTokenizer
from sim.inference.transformer import Transformer
from sim.inference.weights import build_tiny, save_checkpoint
from sim.traces.format import Trace


def _dense_activity(name: str, text: str, n: int, seed: int = 0):
    """Per token: (active ids per layer and slot, experts) from an independent dense run."""
    model = Transformer(build_tiny(name, seed))
    ids = ByteTokenizer().encode(text)[:n]
    rows = {}
    model.forward(ids, hook=lambda layer, x, e, h: rows.setdefault(layer, (e, h)))
    return rows


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mixtral", "tiny-opt"])
def test_trace_holds_the_models_real_activity(name, corpus, tmp_path):
    out = record_trace(name, corpus, 40, tmp_path / "t.npz", seed=7, train_tokens=200, chunk_tokens=16)
    trace = Trace.load(out).materialise()
    m = trace.meta
    assert (m.source, m.model, m.n_tokens, m.seed) == ("recorded", name, 40, 7)
    assert "RANDOM" in m.extra["weights"]
    assert m.activation_threshold == 0.0 and m.has_predictions
    dense = _dense_activity(name, corpus.read_text(encoding="utf-8"), 40, seed=7)
    for layer, (experts, h) in dense.items():
        for t in (0, 17, 39):
            assert np.array_equal(trace.experts(t, layer), experts[t])
            for slot in range(m.top_k):
                assert np.array_equal(trace.active(t, layer, slot), np.flatnonzero(h[t, slot]))


def test_predictor_metadata_matches_the_stored_sets(corpus, tmp_path):
    trace = Trace.load(record_trace("tiny-llama", corpus, 48, tmp_path / "t.npz", train_tokens=300))
    p = trace.meta.predictor
    assert p["kind"] == "lowrank" and p["train_tokens"] == 300 and "held-out" in p["training"]
    assert len(p["recall"]) == len(p["precision"]) == len(p["fnr"]) == trace.meta.n_layers
    assert p["size_bytes"] > 0 and p["flops_per_token"] > 0
    hits = acts = preds = 0
    for chunk in trace.chunks():
        for t in range(chunk.start, chunk.start + chunk.n_tokens):
            for layer in range(trace.meta.n_layers):
                a, q = chunk.active(t, layer), chunk.predicted(t, layer)
                hits += np.intersect1d(a, q).size
                acts += a.size
                preds += q.size
    assert p["recall_mean"] == pytest.approx(hits / acts, abs=1e-5)
    assert p["precision_mean"] == pytest.approx(hits / preds, abs=1e-5)
    assert 0.5 < p["recall_mean"] <= 1.0


def test_oracle_none_and_cross_fitting(short_text, corpus, tmp_path):
    oracle = Trace.load(record_trace("tiny-opt", corpus, 20, tmp_path / "o.npz", predictor="oracle"))
    chunk = next(oracle.chunks())
    assert np.array_equal(chunk.pred_ids, chunk.ids) and oracle.meta.predictor["recall_mean"] == 1.0
    none = Trace.load(record_trace("tiny-opt", corpus, 20, tmp_path / "n.npz", predictor="none"))
    assert not none.meta.has_predictions
    n_bytes = len(short_text.read_bytes())
    cross = Trace.load(record_trace("tiny-llama", short_text, n_bytes, tmp_path / "c.npz"))
    assert "cross-fitting" in cross.meta.predictor["training"]


def test_same_seed_same_trace_other_seed_other_trace(corpus, tmp_path):
    def ids(seed: int, name: str) -> np.ndarray:
        path = record_trace("tiny-mixtral", corpus, 24, tmp_path / name, seed=seed, train_tokens=100)
        return np.concatenate([c.ids for c in Trace.load(path).chunks()])
    a, b, c = ids(3, "a.npz"), ids(3, "b.npz"), ids(4, "c.npz")
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_encoder_threshold_and_explicit_threshold(corpus, tmp_path):
    default = Trace.load(record_trace("tiny-bert", corpus, 30, tmp_path / "b.npz", predictor="none"))
    assert default.meta.activation_threshold == pytest.approx(0.17)
    loose = Trace.load(record_trace("tiny-bert", corpus, 30, tmp_path / "l.npz", predictor="none",
                                    activation_threshold=0.5))
    dens = [np.mean(t.meta.extra["density_per_layer"]) for t in (default, loose)]
    assert dens[1] < dens[0]


def test_checkpoint_directory_as_model(corpus, tmp_path):
    save_checkpoint(build_tiny("tiny-llama", seed=2), tmp_path / "ckpt")
    trace = Trace.load(record_trace(tmp_path / "ckpt", corpus, 16, tmp_path / "t.npz", predictor="oracle"))
    assert trace.meta.model == "ckpt" and "RANDOM" in trace.meta.extra["weights"]


@pytest.mark.parametrize("kwargs, message", [
    ({"n_tokens": 0}, "positive integer"),
    ({"n_tokens": -3}, "positive integer"),
    ({"n_tokens": True}, "positive integer"),
    ({"n_tokens": 10**6}, "text too short"),
    ({"model": "gpt-5"}, "unknown model"),
    ({"predictor": "psychic"}, "unknown predictor"),
    ({"activation_threshold": -1.0}, "activation_threshold"),
    ({"activation_threshold": float("nan")}, "activation_threshold"),
    ({"text_path": "no/such/file.txt"}, "no such text file"),
    ({"prompt_tokens": 99}, "prompt_tokens"),
    ({"chunk_tokens": 0}, "chunk_tokens"),
    ({"target_recall": 0.0}, "target_recall"),
    ({"rank": 0}, "rank"),
])
def test_bad_inputs_raise_one_line_simerror(corpus, tmp_path, kwargs, message):
    args = {"model": "tiny-llama", "text_path": corpus, "n_tokens": 8, "out": tmp_path / "x.npz"} | kwargs
    rest = {k: args.pop(k) for k in list(args) if k not in ("model", "text_path", "n_tokens", "out")}
    with pytest.raises(SimError, match=message) as err:
        record_trace(args["model"], args["text_path"], args["n_tokens"], args["out"], **rest)
    assert "\n" not in str(err.value)


def test_uncached_minilm_points_to_the_setup_step(corpus, tmp_path):
    with pytest.raises(SimError, match=r"sim\.inference\.fetch"):
        record_trace("all-minilm-l6-v2", corpus, 8, tmp_path / "x.npz", cache_dir=tmp_path / "empty")


def test_binary_text_is_rejected(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(SimError, match="UTF-8"):
        record_trace("tiny-llama", bad, 2, tmp_path / "x.npz")


def test_prompt_prefill_records_the_same_activity_as_token_by_token(corpus, tmp_path):
    a = Trace.load(record_trace("tiny-llama", corpus, 30, tmp_path / "a.npz", predictor="none"))
    b = Trace.load(record_trace("tiny-llama", corpus, 30, tmp_path / "b.npz", predictor="none", prompt_tokens=10))
    assert (a.meta.prompt_tokens, b.meta.prompt_tokens) == (0, 10)
    ids_a = np.concatenate([c.ids for c in a.chunks()])
    ids_b = np.concatenate([c.ids for c in b.chunks()])
    assert ids_a.size == ids_b.size and np.mean(ids_a == ids_b) > 0.999


def test_compresslevel_rewrites_the_same_content_smaller(corpus, tmp_path):
    fast = record_trace("tiny-opt", corpus, 64, tmp_path / "a.npz", predictor="oracle")
    small = record_trace("tiny-opt", corpus, 64, tmp_path / "b.npz", predictor="oracle", compresslevel=9)
    assert small.stat().st_size <= fast.stat().st_size
    for a, b in zip(Trace.load(fast).chunks(), Trace.load(small).chunks(), strict=True):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.offsets, b.offsets)
    with pytest.raises(SimError, match="compresslevel"):
        record_trace("tiny-opt", corpus, 8, tmp_path / "c.npz", compresslevel=12)
