"""GGUF loading without the real model: a tiny random Llama written with gguf's writer reads back exactly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import SimError
from sim.inference.bpe import ByteBPE, bytes_to_unicode
from sim.inference.gguf_model import load_gguf, unpermute_rope
from sim.inference.transformer import Transformer
from sim.inference.weights import build_tiny, tiny_config

gguf = pytest.importorskip("gguf")


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF half-split -> interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@settings(max_examples=30, deadline=None)
@given(heads=st.integers(1, 4), half=st.integers(1, 4), cols=st.integers(1, 5))
def test_unpermute_inverts_llama_cpp_permute(heads, half, cols):
    w = np.arange(heads * half * 2 * cols, dtype=np.float32).reshape(heads * half * 2, cols)
    assert np.array_equal(unpermute_rope(_permute(w, heads), heads), w)


def _write_tiny(path, qtype=None):
    # GGUF's llama is SwiGLU; the tiny test model is ReLU-gated unless told otherwise
    weights = build_tiny("tiny-llama", seed=1, config=replace(tiny_config("tiny-llama"), activation="silu",
                                                              norm_eps=2.0**-20))
    cfg, p = weights.config, weights.params
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_positions)
    w.add_embedding_length(cfg.hidden)
    w.add_feed_forward_length(cfg.n_neurons)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    b2u = bytes_to_unicode()
    tokens = ["<pad>", "<s>", "</s>"] + [b2u[b] for b in range(256)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * 256)
    w.add_token_merges([])
    names = {"norm1": "attn_norm", "norm2": "ffn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v",
             "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
    w.add_tensor("token_embd.weight", p["embed.weight"])
    w.add_tensor("output_norm.weight", p["final_norm.weight"])
    if "lm_head.weight" in p:
        w.add_tensor("output.weight", p["lm_head.weight"])
    for i in range(cfg.n_layers):
        for canon, g in names.items():
            t = p[f"l{i}.{canon}.weight"]
            if canon in ("q", "k"):
                t = _permute(t, cfg.n_heads if canon == "q" else cfg.n_kv_heads)
            if qtype is not None and t.ndim == 2:
                t = gguf.quants.quantize(t, qtype)
                w.add_tensor(f"blk.{i}.{g}.weight", t, raw_dtype=qtype)
            else:
                w.add_tensor(f"blk.{i}.{g}.weight", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


def test_tiny_llama_round_trips_through_gguf(tmp_path):
    ref = _write_tiny(tmp_path / "tiny.gguf")
    gm = load_gguf(tmp_path / "tiny.gguf")
    assert gm.weights.config.n_layers == ref.config.n_layers and gm.formats == {"F32": gm.formats["F32"]}
    ids = np.array([5, 70, 71, 72, 9])
    a, b = Transformer(ref), Transformer(gm.weights)
    np.testing.assert_allclose(b.logits(b.forward(ids)), a.logits(a.forward(ids)), rtol=1e-5, atol=1e-5)
    tok = ByteBPE(**{k: v for k, v in gm.tokenizer.items() if k in ("tokens", "merges", "token_type", "bos", "eos")})
    assert tok.decode(tok.encode("héllo <s> 42")) == "héllo <s> 42"
    assert tok.encode("<s>").tolist() == [1]


def test_q4_1_tensors_are_dequantised_close_to_the_originals(tmp_path):
    ref = _write_tiny(tmp_path / "q.gguf", qtype=gguf.GGMLQuantizationType.Q4_1)
    gm = load_gguf(tmp_path / "q.gguf")
    assert gm.formats.get("Q4_1", 0) > 0
    for name in ("l0.up.weight", "l1.q.weight"):
        err = np.abs(gm.weights.params[name] - ref.params[name]).max()
        span = np.ptp(ref.params[name])
        assert 0 < err <= span / 15 * 0.51 + 1e-6  # 4-bit levels over each 32-value block's range


def test_bad_files_are_one_line_errors(tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"nope" * 10)
    with pytest.raises(SimError, match="not a GGUF file"):
        load_gguf(tmp_path / "junk.gguf")
    with pytest.raises(SimError, match="no such GGUF file"):
        load_gguf(tmp_path / "absent.gguf")
