"""The numpy transformer: KV-cache decode, sparse execution, encoder vs decoder attention."""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import SimError
from sim.inference.predictor import OraclePredictor
from sim.inference.tokenizer import WordPiece
from sim.inference.transformer import Transformer
from sim.inference.weights import build_tiny, load_checkpoint

DECODERS = ["tiny-llama", "tiny-mixtral", "tiny-opt"]


@pytest.mark.parametrize("name", DECODERS)
def test_incremental_decode_equals_full_forward(name):
    model = Transformer(build_tiny(name, seed=1))
    ids = np.random.default_rng(0).integers(3, 259, size=21)
    full = model.forward(ids)
    cache = model.new_cache()
    parts = [model.forward(ids[:5], cache)]  # prefill a prompt, then decode token by token
    parts += [model.forward(ids[t:t + 1], cache) for t in range(5, len(ids))]
    assert cache.length == len(ids)
    assert np.allclose(np.concatenate(parts), full, atol=1e-4)


@pytest.mark.parametrize("name", DECODERS)
def test_decoders_are_causal(name):
    model = Transformer(build_tiny(name, seed=2))
    ids = np.arange(3, 15)
    changed = ids.copy()
    changed[-1] = 200
    a, b = model.forward(ids), model.forward(changed)
    assert np.allclose(a[:-1], b[:-1], atol=1e-6)
    assert not np.allclose(a[-1], b[-1])


def test_encoder_is_bidirectional():
    model = Transformer(build_tiny("tiny-bert", seed=2))
    ids = np.arange(3, 15)
    changed = ids.copy()
    changed[-1] = 200
    assert not np.allclose(model.forward(ids)[0], model.forward(changed)[0])
    with pytest.raises(SimError, match="KV cache"):
        model.forward(ids, model.new_cache())


@pytest.mark.parametrize("name", DECODERS)
def test_sparse_model_with_oracle_equals_dense(name):
    model = Transformer(build_tiny(name, seed=3))
    ids = np.arange(3, 19)
    dense = model.forward(ids)
    sparse = model.forward(ids, active=OraclePredictor(model, 0.0))
    assert np.allclose(sparse, dense, atol=1e-4)
    # and dropping real activity does change the result
    def drop_half(layer, x, experts):
        mask = OraclePredictor(model, 0.0)(layer, x, experts)
        mask[..., ::2] = False
        return mask
    assert not np.allclose(model.forward(ids, active=drop_half), dense, atol=1e-3)


def test_hook_sees_every_layer_with_router_choices():
    model = Transformer(build_tiny("tiny-mixtral", seed=0))
    seen = []
    model.forward(np.arange(3, 10), hook=lambda layer, x, e, h: seen.append((layer, x.shape, e.shape, h.shape)))
    cfg = model.cfg
    assert [s[0] for s in seen] == list(range(cfg.n_layers))
    assert all(s[1:] == ((7, cfg.hidden), (7, 2), (7, 2, cfg.n_neurons)) for s in seen)


def test_out_of_range_tokens_and_positions_raise():
    model = Transformer(build_tiny("tiny-llama"))
    with pytest.raises(SimError, match="token ids"):
        model.forward(np.array([5, 9999]))
    with pytest.raises(SimError, match="positions"):
        model.forward(np.full(model.cfg.max_positions + 1, 5))


def test_minilm_reproduces_published_sentence_similarities(minilm):
    """sentence-transformers' quick-start figures for all-MiniLM-L6-v2 (mean pooling, cosine)."""
    model = Transformer(load_checkpoint(minilm))
    tok = WordPiece.from_file(minilm / "vocab.txt")
    sentences = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    emb = []
    for s in sentences:
        ids = np.concatenate([[tok.cls], tok.encode(s), [tok.sep]])
        e = model.forward(ids).mean(axis=0)
        emb.append(e / np.linalg.norm(e))
    sim = np.array(emb) @ np.array(emb).T
    assert sim[0, 1] == pytest.approx(0.6660, abs=1e-3)
    assert sim[0, 2] == pytest.approx(0.1046, abs=1e-3)
    assert sim[1, 2] == pytest.approx(0.1411, abs=1e-3)
