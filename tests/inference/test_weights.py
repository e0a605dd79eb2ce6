"""Checkpoint loading: name maps per architecture, dtypes, shape checks, tiny builders."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from sim.errors import SimError
from sim.inference.transformer import Transformer
from sim.inference.weights import TINY_MODELS, build_tiny, load_checkpoint, save_checkpoint


@pytest.mark.parametrize("name", TINY_MODELS)
def test_checkpoint_round_trip_preserves_params_and_outputs(name, tmp_path):
    w = build_tiny(name, seed=4)
    save_checkpoint(w, tmp_path / name)
    back = load_checkpoint(tmp_path / name, name=name)
    assert back.config == w.config
    assert set(back.params) == set(w.params)
    for key, value in w.params.items():
        assert np.array_equal(back.params[key], value), key
    assert not back.real, "random weights must stay marked as random after a round trip"
    ids = np.arange(3, 12)
    assert np.allclose(Transformer(back).forward(ids), Transformer(w).forward(ids))


def test_hf_names_are_the_published_ones(tmp_path):
    save_checkpoint(build_tiny("tiny-mixtral"), tmp_path / "m")
    names = set(load_file(str(tmp_path / "m" / "model.safetensors")))
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in names
    assert "model.layers.2.block_sparse_moe.gate.weight" in names
    assert "model.layers.1.self_attn.k_proj.weight" in names
    save_checkpoint(build_tiny("tiny-opt"), tmp_path / "o")
    names = set(load_file(str(tmp_path / "o" / "model.safetensors")))
    assert {"model.decoder.layers.0.fc1.bias", "model.decoder.embed_positions.weight",
            "model.decoder.final_layer_norm.weight"} <= names


def test_fp16_storage_is_widened_to_fp32(tmp_path):
    w = build_tiny("tiny-llama", seed=1)
    save_checkpoint(w, tmp_path / "h", dtype="float16")
    back = load_checkpoint(tmp_path / "h")
    assert all(v.dtype == np.float32 for v in back.params.values())
    assert np.allclose(back.params["l0.q.weight"], w.params["l0.q.weight"], atol=2e-3)


def _bf16_file(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = (arr.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_bf16_tensors_are_read(tmp_path):
    w = build_tiny("tiny-llama", seed=1)
    d = tmp_path / "bf"
    save_checkpoint(w, d)
    tensors = load_file(str(d / "model.safetensors"))
    _bf16_file(d / "model.safetensors", tensors)
    back = load_checkpoint(d)
    assert np.allclose(back.params["l1.up.weight"], w.params["l1.up.weight"], rtol=1e-2, atol=1e-2)


def test_bert_prefix_is_handled(tmp_path):
    d = tmp_path / "bert"
    save_checkpoint(build_tiny("tiny-bert"), d)
    tensors = load_file(str(d / "model.safetensors"))
    save_file({"bert." + k: v for k, v in tensors.items()}, str(d / "model.safetensors"))
    assert load_checkpoint(d).config.arch == "bert"


def test_missing_lm_head_falls_back_to_the_tied_embedding(tmp_path):
    d = tmp_path / "llama"
    save_checkpoint(build_tiny("tiny-llama"), d)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    w = load_checkpoint(d)
    model = Transformer(w)
    hidden = model.forward(np.arange(3, 8))
    assert np.allclose(model.logits(hidden), hidden @ w.params["embed.weight"].T)


@pytest.mark.parametrize("change, message", [
    (lambda cfg: cfg.update(model_type="gpt2"), "unsupported model_type"),
    (lambda cfg: cfg.update(hidden_act="tanh"), "unsupported activation"),
    (lambda cfg: cfg.update(num_key_value_heads=3), "multiple of num_key_value_heads"),
    (lambda cfg: cfg.update(rope_scaling={"type": "llama3"}), "rope_scaling"),
    (lambda cfg: cfg.update(hidden_size=-1), "positive integer"),
])
def test_bad_configs_raise_one_line_errors(tmp_path, change, message):
    d = tmp_path / "m"
    save_checkpoint(build_tiny("tiny-llama"), d)
    cfg = json.loads((d / "config.json").read_text())
    change(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SimError, match=message) as err:
        load_checkpoint(d)
    assert "\n" not in str(err.value)


def test_missing_tensor_wrong_shape_and_bad_files(tmp_path):
    d = tmp_path / "m"
    save_checkpoint(build_tiny("tiny-llama"), d)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(SimError, match="missing"):
        load_checkpoint(d)
    tensors["model.layers.1.mlp.down_proj.weight"] = np.zeros((3, 3), np.float32)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(SimError, match="shape"):
        load_checkpoint(d)
    (d / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SimError, match="safetensors"):
        load_checkpoint(d)
    with pytest.raises(SimError, match="no such model directory"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SimError, match=r"config\.json"):
        load_checkpoint(tmp_path / "empty")


def test_tiny_builder_is_seeded():
    a, b, c = build_tiny("tiny-opt", 1), build_tiny("tiny-opt", 1), build_tiny("tiny-opt", 2)
    assert np.array_equal(a.params["l0.up.weight"], b.params["l0.up.weight"])
    assert not np.array_equal(a.params["l0.up.weight"], c.params["l0.up.weight"])
    assert not a.real and "random" in a.origin
    with pytest.raises(SimError, match="unknown tiny model"):
        build_tiny("tiny-gpt")


def test_minilm_checkpoint_loads_with_expected_dims(minilm):
    w = load_checkpoint(minilm)
    cfg = w.config
    assert (cfg.arch, cfg.n_layers, cfg.hidden, cfg.n_neurons, cfg.activation) == ("bert", 6, 384, 1536, "gelu")
    assert w.real
