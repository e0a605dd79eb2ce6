"""Load a Llama-family GGUF file (llama.cpp's format) into the numpy core's canonical weights.

GGUF stores quantised blocks (here Q4_1 for the projections, Q8_0 for the embedding, F32
for the norms); the PyPI ``gguf`` package dequantises each tensor to fp32, which is what
the numpy core computes in. The file's header (metadata and tensor table) is parsed here
with ``struct`` against ``gguf``'s type constants: ``gguf.GGUFReader`` builds a numpy view
per metadata item, and SmolLM2's 98,000 tokenizer strings took it over a minute.

Two conventions differ from Hugging Face's and are undone here so that
:class:`~sim.inference.transformer.Transformer` (HF layout, "rotate_half" RoPE) runs the
file unchanged:

- llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` so that RoPE rotates
  adjacent pairs (GPT-J style); :func:`unpermute_rope` restores HF's half-split order. The
  attention scores are the same either way (q and k are permuted alike).
- a missing ``output.weight`` means the LM head is tied to ``token_embd``.

The tokenizer (GPT-2 byte-level BPE: tokens, merges, special ids) comes from the same
file's metadata (:class:`~sim.inference.bpe.ByteBPE`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SimError

from .weights import ModelConfig, ModelWeights

# GGUF tensor name (per layer, after "blk.{i}.") -> canonical name (after "l{i}.")
_LAYER_NAMES = {"attn_norm.weight": "norm1.weight", "ffn_norm.weight": "norm2.weight",
                "attn_q.weight": "q.weight", "attn_k.weight": "k.weight", "attn_v.weight": "v.weight",
                "attn_output.weight": "o.weight", "ffn_gate.weight": "gate.weight",
                "ffn_up.weight": "up.weight", "ffn_down.weight": "down.weight"}
_TOP_NAMES = {"token_embd.weight": "embed.weight", "output_norm.weight": "final_norm.weight",
              "output.weight": "lm_head.weight"}


@dataclass
class GGUFModel:
    """Weights plus the tokenizer metadata and the quantisation formats the file used."""

    weights: ModelWeights
    tokenizer: dict[str, Any]  # tokens, merges, token_type, bos/eos ids, pre
    formats: dict[str, int]  # tensor type name -> number of tensors


@dataclass
class TensorInfo:
    """One tensor of a GGUF file: its name, ggml type, numpy-order shape and raw bytes."""

    name: str
    qtype: int
    shape: tuple[int, ...]  # numpy order (GGUF lists dimensions innermost first)
    data: np.ndarray  # uint8, (rows, bytes per row)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf: bytes, src: str):
        self.buf, self.pos, self.src = buf, 0, src

    def take(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise SimError("truncated GGUF header", source=self.src) from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise SimError("truncated GGUF header", source=self.src)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.take("<I"), self.take("<Q")
            if itype in _SCALARS:  # one unpack for the whole array
                fmt = _SCALARS[itype]
                size = struct.calcsize(fmt)
                arr = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=self.pos)
                self.pos += size * count
                return arr.tolist()
            return [self.value(itype) for _ in range(count)]
        if vtype not in _SCALARS:
            raise SimError(f"unknown GGUF value type {vtype}", source=self.src)
        return self.take(_SCALARS[vtype])


def read_gguf(path: str | Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The metadata and tensor table of a GGUF (v2/v3) file; tensor data are views of one read."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    src = str(path)
    buf = Path(path).read_bytes()
    cur = _Cursor(buf, src)
    if buf[:4] != b"GGUF":
        raise SimError("not a GGUF file (bad magic)", source=src)
    cur.pos = 4
    version = cur.take("<I")
    if version not in (2, 3):
        raise SimError(f"unsupported GGUF version {version}; supported: 2, 3", source=src)
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        fields[key] = cur.value(cur.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
        infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
    align = int(fields.get("general.alignment", 32))
    start = -(-cur.pos // align) * align
    data = np.frombuffer(buf, dtype=np.uint8)
    tensors = []
    for name, dims, qtype, offset in infos:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        except (ValueError, KeyError):
            raise SimError(f"tensor {name} has an unknown ggml type {qtype}", source=src) from None
        row_bytes = dims[0] // block * type_size
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        lo = start + offset
        if lo + rows * row_bytes > data.size:
            raise SimError(f"tensor {name} runs past the end of the file", source=src)
        tensors.append(TensorInfo(name, qtype, tuple(reversed(dims)), data[lo:lo + rows * row_bytes].reshape(rows,
                                                                                                    row_bytes)))
    return fields, tensors


def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` for q/k rows: interleaved pairs -> HF half-split."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(fields: dict[str, Any], key: str, src: str, default: Any = None) -> Any:
    value = fields.get(key)
    if value is None:
        if default is None:
            raise SimError("missing GGUF metadata key", source=src, field=key)
        return default
    return value


def _positive(value: Any, key: str, src: str) -> int:
    if not isinstance(value, int | np.integer) or int(value) < 1:
        raise SimError(f"must be a positive integer, got {value!r}", source=src, field=key)
    return int(value)


def load_gguf(path: str | Path, name: str | None = None) -> GGUFModel:
    """Read a Llama-architecture GGUF file into fp32 canonical weights (dequantised with ``gguf``)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    path = Path(path)
    src = str(path)
    if not path.is_file():
        raise SimError("no such GGUF file", source=src)
    try:
        meta, tensors = read_gguf(path)
    except OSError as exc:
        raise SimError(f"cannot read the GGUF file ({exc})", source=src) from None
    arch = _field(meta, "general.architecture", src)
    if arch != "llama":
        raise SimError(f"unsupported architecture {arch!r}; supported: ['llama']", source=src,
                       field="general.architecture")
    hidden = _positive(_field(meta, "llama.embedding_length", src), "llama.embedding_length", src)
    n_heads = _positive(_field(meta, "llama.attention.head_count", src), "llama.attention.head_count", src)
    n_kv = _positive(_field(meta, "llama.attention.head_count_kv", src, n_heads), "llama.attention.head_count_kv",
                     src)
    n_layers = _positive(_field(meta, "llama.block_count", src), "llama.block_count", src)
    n_ff = _positive(_field(meta, "llama.feed_forward_length", src), "llama.feed_forward_length", src)
    tokens = list(_field(meta, "tokenizer.ggml.tokens", src))
    if _field(meta, "tokenizer.ggml.model", src) != "gpt2":
        raise SimError("only GPT-2 byte-level BPE tokenizers are supported", source=src, field="tokenizer.ggml.model")
    if n_heads % n_kv or hidden % n_heads:
        raise SimError(f"head counts {n_heads}/{n_kv} do not divide hidden {hidden}", source=src,
                       field="llama.attention.head_count_kv")
    if _field(meta, "llama.rope.scaling.type", src, "none") not in ("none",):
        raise SimError("rope scaling is not supported by the numpy core", source=src, field="llama.rope.scaling.type")
    params: dict[str, np.ndarray] = {}
    formats: dict[str, int] = {}
    for t in tensors:
        if t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            canon = _LAYER_NAMES.get(rest)
            key = f"l{int(layer)}.{canon}" if canon else None
        else:
            key = _TOP_NAMES.get(t.name)
        if key is None:
            continue  # e.g. rope_freqs: not used by plain Llama RoPE
        qtype = GGMLQuantizationType(t.qtype)
        try:
            w = np.asarray(dequantize(t.data, qtype), dtype=np.float32).reshape(t.shape)
        except NotImplementedError as exc:
            raise SimError(f"tensor {t.name} has an unsupported format {qtype.name} ({exc})", source=src) from None
        formats[qtype.name] = formats.get(qtype.name, 0) + 1
        if key.endswith(".q.weight"):
            w = unpermute_rope(w, n_heads)
        elif key.endswith(".k.weight"):
            w = unpermute_rope(w, n_kv)
        params[key] = np.ascontiguousarray(w.reshape(w.shape[0], -1) if w.ndim > 1 else w)
    vocab = len(tokens)
    cfg = ModelConfig(arch="llama", name=name or str(_field(meta, "general.name", src, path.stem)),
                      vocab_size=vocab, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                      head_dim=hidden // n_heads, n_neurons=n_ff, activation="silu", glu=True, norm="rms",
                      norm_eps=float(_field(meta, "llama.attention.layer_norm_rms_epsilon", src, 1e-5)),
                      post_norm=False, causal=True,
                      max_positions=_positive(_field(meta, "llama.context_length", src, 2048),
                                              "llama.context_length", src),
                      rope_theta=float(_field(meta, "llama.rope.freq_base", src, 10000.0)),
                      tie_embeddings="lm_head.weight" not in params, tokenizer="bpe")
    missing = [f"l{i}.{c}" for i in range(n_layers) for c in _LAYER_NAMES.values() if f"l{i}.{c}" not in params]
    missing += [c for c in ("embed.weight", "final_norm.weight") if c not in params]
    if missing:
        raise SimError(f"missing tensors {missing[:3]}{' ...' if len(missing) > 3 else ''}", source=src)
    if params["embed.weight"].shape != (vocab, hidden):
        raise SimError(f"token_embd has shape {params['embed.weight'].shape}, expected {(vocab, hidden)}",
                       source=src)
    tok = {"tokens": tokens, "merges": list(_field(meta, "tokenizer.ggml.merges", src, [])),
           "token_type": [int(x) for x in _field(meta, "tokenizer.ggml.token_type", src, [1] * vocab)],
           "bos": int(_field(meta, "tokenizer.ggml.bos_token_id", src, -1)),
           "eos": int(_field(meta, "tokenizer.ggml.eos_token_id", src, -1)),
           "pre": str(_field(meta, "tokenizer.ggml.pre", src, "default"))}
    weights = ModelWeights(cfg, params, real=True, origin=src)
    return GGUFModel(weights, tok, formats)
