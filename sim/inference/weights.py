"""Model configurations and weights: Hugging Face safetensors checkpoints and tiny test models.

A model is a :class:`ModelConfig` plus a flat dict of fp32 numpy arrays under *canonical*
names (``embed.weight``, ``l3.q.weight``, ``l3.e5.gate.weight`` ...). Each supported
architecture has a name map from canonical names to the Hugging Face tensor names, used in
both directions: :func:`load_checkpoint` reads a checkpoint directory (``config.json`` plus
``*.safetensors``, read with the ``safetensors`` package's numpy API, no torch), and
:func:`save_checkpoint` writes one, so tests can round-trip tiny models through the loader.

Supported ``model_type`` values: ``llama``/``mistral``/``qwen2`` (RMSNorm, RoPE, GQA,
gated FFN), ``mixtral`` (the same with a routed mixture of experts), ``opt`` (LayerNorm,
learned positions, ReLU MLP) and ``bert`` (post-norm encoder, GELU MLP). Weights stored as
fp16 or bf16 are widened to fp32 at load time: compute is fp32 throughout.

Tiny models (:func:`build_tiny`) have random weights. They exist so tests and examples run
without any download; traces recorded from them say so in their metadata and are never
presented as a real model's behaviour.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SimError

ARCHS = ("llama", "mixtral", "opt", "bert")
ACTIVATIONS = ("relu", "drelu", "silu", "gelu", "gelu_tanh")
# Activations whose zero set is exact: with them a neuron is active iff its output is non-zero.
RELU_FAMILY = ("relu", "drelu")

_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "mixtral": "mixtral",
                "opt": "opt", "bert": "bert"}
_ACT_ALIASES = {"relu": "relu", "drelu": "drelu", "silu": "silu", "swish": "silu", "gelu": "gelu",
                "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}


@dataclass(frozen=True)
class ModelConfig:
    """The shape and flavour of a transformer, enough to run its forward pass."""

    arch: str  # one of ARCHS
    name: str
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_neurons: int  # FFN width (per expert for MoE)
    activation: str  # one of ACTIVATIONS
    glu: bool  # gated FFN (gate, up, down) rather than a plain MLP (up, down)
    norm: str  # "rms" or "layer"
    norm_eps: float
    post_norm: bool  # BERT-style: normalise after the residual add
    causal: bool  # decoder (causal, KV cache) or encoder (bidirectional)
    max_positions: int
    n_experts: int = 1
    top_k: int = 1
    rope_theta: float | None = None  # None: learned absolute positions
    type_vocab_size: int = 0
    tie_embeddings: bool = False
    attn_bias: bool = False
    sliding_window: int | None = None
    tokenizer: str = "wordpiece"  # "wordpiece" (vocab.txt) or "bytes" (tiny models)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ModelWeights:
    """A config plus fp32 parameters under canonical names."""

    config: ModelConfig
    params: dict[str, np.ndarray]
    real: bool  # True for a trained checkpoint, False for random test weights
    origin: str  # where the weights came from (path or "random, seed N")

    def get(self, name: str) -> np.ndarray | None:
        return self.params.get(name)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.params[name]


# ---------------------------------------------------------------------------------------
# name maps: canonical name -> Hugging Face name, relative to the model's base prefix
# ---------------------------------------------------------------------------------------
def _layer_map(cfg: ModelConfig, i: int) -> dict[str, str]:
    """Canonical -> HF names for layer ``i`` (relative to the base prefix)."""
    if cfg.arch in ("llama", "mixtral"):
        p = f"layers.{i}."
        m = {"norm1.weight": "input_layernorm.weight", "norm2.weight": "post_attention_layernorm.weight",
             "q.weight": "self_attn.q_proj.weight", "k.weight": "self_attn.k_proj.weight",
             "v.weight": "self_attn.v_proj.weight", "o.weight": "self_attn.o_proj.weight"}
        if cfg.attn_bias:
            m |= {"q.bias": "self_attn.q_proj.bias", "k.bias": "self_attn.k_proj.bias",
                  "v.bias": "self_attn.v_proj.bias"}
        if cfg.arch == "llama":
            m |= {"gate.weight": "mlp.gate_proj.weight", "up.weight": "mlp.up_proj.weight",
                  "down.weight": "mlp.down_proj.weight"}
        else:
            m["router.weight"] = "block_sparse_moe.gate.weight"
            for e in range(cfg.n_experts):
                x = f"block_sparse_moe.experts.{e}."
                m |= {f"e{e}.gate.weight": x + "w1.weight", f"e{e}.down.weight": x + "w2.weight",
                      f"e{e}.up.weight": x + "w3.weight"}
    elif cfg.arch == "opt":
        p = f"layers.{i}."
        m = {}
        for c, hf in (("norm1", "self_attn_layer_norm"), ("norm2", "final_layer_norm"),
                      ("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
                      ("o", "self_attn.out_proj"), ("up", "fc1"), ("down", "fc2")):
            m |= {f"{c}.weight": f"{hf}.weight", f"{c}.bias": f"{hf}.bias"}
    else:  # bert
        p = f"encoder.layer.{i}."
        m = {}
        for c, hf in (("q", "attention.self.query"), ("k", "attention.self.key"),
                      ("v", "attention.self.value"), ("o", "attention.output.dense"),
                      ("norm1", "attention.output.LayerNorm"), ("up", "intermediate.dense"),
                      ("down", "output.dense"), ("norm2", "output.LayerNorm")):
            m |= {f"{c}.weight": f"{hf}.weight", f"{c}.bias": f"{hf}.bias"}
    return {f"l{i}.{k}": p + v for k, v in m.items()}


def name_map(cfg: ModelConfig) -> tuple[dict[str, str], dict[str, str], tuple[str, ...]]:
    """Return (required, optional, base prefixes to try) for an architecture.

    Names in the maps are relative to a base prefix (``model.`` for ``LlamaForCausalLM``,
    empty for a bare ``LlamaModel``), except ``lm_head.weight``, which lives at the top.
    """
    if cfg.arch in ("llama", "mixtral"):
        req = {"embed.weight": "embed_tokens.weight", "final_norm.weight": "norm.weight"}
        bases: tuple[str, ...] = ("model.", "")
    elif cfg.arch == "opt":
        req = {"embed.weight": "embed_tokens.weight", "pos_embed.weight": "embed_positions.weight"}
        if not cfg.post_norm:
            req |= {"final_norm.weight": "final_layer_norm.weight", "final_norm.bias": "final_layer_norm.bias"}
        bases = ("model.decoder.", "decoder.", "")
    else:
        req = {"embed.weight": "embeddings.word_embeddings.weight",
               "pos_embed.weight": "embeddings.position_embeddings.weight",
               "type_embed.weight": "embeddings.token_type_embeddings.weight",
               "embed_norm.weight": "embeddings.LayerNorm.weight", "embed_norm.bias": "embeddings.LayerNorm.bias"}
        bases = ("", "bert.")
    for i in range(cfg.n_layers):
        req |= _layer_map(cfg, i)
    optional = {} if cfg.causal is False else {"lm_head.weight": "lm_head.weight"}
    return req, optional, bases


# ---------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------
def _int(raw: dict[str, Any], key: str, src: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SimError(f"must be a positive integer, got {value!r}", source=src, field=key)
    return value


def config_from_hf(raw: dict[str, Any], name: str, src: str = "config.json") -> ModelConfig:
    """Translate a Hugging Face ``config.json`` dict into a :class:`ModelConfig`."""
    mtype = raw.get("model_type")
    if mtype not in _MODEL_TYPES:
        raise SimError(f"unsupported model_type {mtype!r}; supported: {sorted(_MODEL_TYPES)}",
                       source=src, field="model_type")
    arch = _MODEL_TYPES[mtype]
    act_key = "activation_function" if arch == "opt" else "hidden_act"
    act_raw = raw.get(act_key, "relu" if arch == "opt" else None)
    if act_raw not in _ACT_ALIASES:
        raise SimError(f"unsupported activation {act_raw!r}; supported: {sorted(_ACT_ALIASES)}",
                       source=src, field=act_key)
    hidden = _int(raw, "hidden_size", src)
    n_heads = _int(raw, "num_attention_heads", src)
    n_layers = _int(raw, "num_hidden_layers", src)
    vocab = _int(raw, "vocab_size", src)
    if hidden % n_heads:
        raise SimError(f"hidden_size {hidden} is not a multiple of num_attention_heads {n_heads}",
                       source=src, field="num_attention_heads")
    common = dict(name=name, vocab_size=vocab, hidden=hidden, n_layers=n_layers, n_heads=n_heads,
                  activation=_ACT_ALIASES[act_raw], tokenizer=str(raw.get("phonesim_tokenizer", "wordpiece")))
    if arch in ("llama", "mixtral"):
        if raw.get("rope_scaling"):
            raise SimError("rope_scaling is not supported by the numpy core", source=src, field="rope_scaling")
        n_kv = _int(raw, "num_key_value_heads", src, n_heads)
        if n_heads % n_kv:
            raise SimError(f"num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv}",
                           source=src, field="num_key_value_heads")
        moe = arch == "mixtral"
        n_exp = _int(raw, "num_local_experts", src) if moe else 1
        top_k = _int(raw, "num_experts_per_tok", src) if moe else 1
        if top_k > n_exp:
            raise SimError(f"num_experts_per_tok {top_k} exceeds num_local_experts {n_exp}", source=src,
                           field="num_experts_per_tok")
        window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
        return ModelConfig(arch=arch, n_kv_heads=n_kv, head_dim=int(raw.get("head_dim") or hidden // n_heads),
                           n_neurons=_int(raw, "intermediate_size", src), glu=True, norm="rms",
                           norm_eps=float(raw.get("rms_norm_eps", 1e-6)), post_norm=False, causal=True,
                           max_positions=_int(raw, "max_position_embeddings", src, 4096),
                           n_experts=n_exp, top_k=top_k, rope_theta=float(raw.get("rope_theta", 10000.0)),
                           tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
                           attn_bias=mtype == "qwen2" or bool(raw.get("attention_bias", False)),
                           sliding_window=int(window) if isinstance(window, int) and window > 0 else None,
                           **common)
    if arch == "opt":
        proj = raw.get("word_embed_proj_dim", hidden)
        if proj != hidden:
            raise SimError(f"word_embed_proj_dim {proj} != hidden_size {hidden} (project_in/out) is not supported",
                           source=src, field="word_embed_proj_dim")
        return ModelConfig(arch=arch, n_kv_heads=n_heads, head_dim=hidden // n_heads,
                           n_neurons=_int(raw, "ffn_dim", src), glu=False, norm="layer", norm_eps=1e-5,
                           post_norm=not bool(raw.get("do_layer_norm_before", True)), causal=True,
                           max_positions=_int(raw, "max_position_embeddings", src, 2048),
                           tie_embeddings=bool(raw.get("tie_word_embeddings", True)), attn_bias=True, **common)
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise SimError("only absolute position embeddings are supported", source=src,
                       field="position_embedding_type")
    return ModelConfig(arch=arch, n_kv_heads=n_heads, head_dim=hidden // n_heads,
                       n_neurons=_int(raw, "intermediate_size", src), glu=False, norm="layer",
                       norm_eps=float(raw.get("layer_norm_eps", 1e-12)), post_norm=True, causal=False,
                       max_positions=_int(raw, "max_position_embeddings", src, 512),
                       type_vocab_size=_int(raw, "type_vocab_size", src, 2), attn_bias=True, **common)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The inverse of :func:`config_from_hf` (enough for it to read the result back)."""
    out: dict[str, Any] = {"model_type": {"llama": "llama", "mixtral": "mixtral", "opt": "opt",
                                          "bert": "bert"}[cfg.arch],
                           "hidden_size": cfg.hidden, "num_attention_heads": cfg.n_heads,
                           "num_hidden_layers": cfg.n_layers, "vocab_size": cfg.vocab_size,
                           "max_position_embeddings": cfg.max_positions, "phonesim_tokenizer": cfg.tokenizer}
    if cfg.arch in ("llama", "mixtral"):
        out |= {"hidden_act": cfg.activation, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
                "intermediate_size": cfg.n_neurons, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
                "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": cfg.attn_bias}
        if cfg.arch == "mixtral":
            out |= {"num_local_experts": cfg.n_experts, "num_experts_per_tok": cfg.top_k}
        if cfg.sliding_window:
            out["sliding_window"] = cfg.sliding_window
    elif cfg.arch == "opt":
        out |= {"activation_function": cfg.activation, "ffn_dim": cfg.n_neurons,
                "do_layer_norm_before": not cfg.post_norm, "tie_word_embeddings": cfg.tie_embeddings}
    else:
        out |= {"hidden_act": cfg.activation, "intermediate_size": cfg.n_neurons, "layer_norm_eps": cfg.norm_eps,
                "type_vocab_size": cfg.type_vocab_size}
    return out


# ---------------------------------------------------------------------------------------
# safetensors I/O
# ---------------------------------------------------------------------------------------
def _read_bf16(path: Path, name: str) -> np.ndarray:
    """numpy has no bfloat16: read the raw bits from the file and widen them to fp32."""
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        info = header[name]
        start, end = info["data_offsets"]
        fh.seek(8 + n + start)
        bits = np.frombuffer(fh.read(end - start), dtype="<u2")
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


def _read_tensors(files: list[Path], wanted: set[str] | None = None) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError, safe_open

    out: dict[str, np.ndarray] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as fh:
                for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if wanted is not None and key not in wanted:
                        continue
                    if fh.get_slice(key).get_dtype() == "BF16":
                        out[key] = _read_bf16(path, key)
                    else:
                        out[key] = fh.get_tensor(key)
        except (SafetensorError, OSError, ValueError, KeyError) as exc:
            raise SimError(f"cannot read safetensors file ({exc})", source=str(path)) from None
    return out


def _tensor_names(files: list[Path]) -> set[str]:
    from safetensors import SafetensorError, safe_open

    names: set[str] = set()
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as fh:
                names.update(fh.keys())
        except (SafetensorError, OSError, ValueError) as exc:
            raise SimError(f"cannot read safetensors file ({exc})", source=str(path)) from None
    return names


def load_checkpoint(directory: str | Path, name: str | None = None) -> ModelWeights:
    """Load ``config.json`` + ``*.safetensors`` from a directory into fp32 canonical params."""
    directory = Path(directory)
    src = str(directory)
    if not directory.is_dir():
        raise SimError("no such model directory", source=src)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise SimError("model directory has no config.json", source=src)
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SimError(f"cannot parse config.json ({exc})", source=str(cfg_path)) from None
    if not isinstance(raw, dict):
        raise SimError("config.json must hold a JSON object", source=str(cfg_path))
    cfg = config_from_hf(raw, name or directory.name, str(cfg_path))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise SimError("model directory has no .safetensors file", source=src)
    req, opt, bases = name_map(cfg)
    present = _tensor_names(files)
    base = next((b for b in bases if b + req["embed.weight"] in present), None)
    if base is None:
        raise SimError(f"tensor {bases[0] + req['embed.weight']!r} not found; is this a {cfg.arch} checkpoint?",
                       source=src)
    full = {c: base + hf for c, hf in req.items()}
    missing = sorted(hf for hf in full.values() if hf not in present)
    if missing:
        raise SimError(f"{len(missing)} tensors missing, e.g. {missing[0]!r}", source=src)
    full |= {c: hf for c, hf in opt.items() if hf in present}
    tensors = _read_tensors(files, set(full.values()))
    params = {c: np.asarray(tensors[hf], dtype=np.float32) for c, hf in full.items()}
    real = not bool(raw.get("phonesim_random_weights", False))
    weights = ModelWeights(cfg, params, real=real, origin=src if real else f"{src} (random weights)")
    check_shapes(weights, src)
    return weights


def save_checkpoint(weights: ModelWeights, directory: str | Path, dtype: str = "float32") -> Path:
    """Write a model as a Hugging Face-style directory (config.json + model.safetensors)."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = weights.config
    req, opt, bases = name_map(cfg)
    names = {c: bases[0] + hf for c, hf in req.items()} | {c: hf for c, hf in opt.items()}
    tensors = {names[c]: np.ascontiguousarray(v.astype(dtype)) for c, v in weights.params.items() if c in names}
    save_file(tensors, str(directory / "model.safetensors"))
    hf = config_to_hf(cfg)
    if not weights.real:  # keeps random test weights from being taken for a trained model
        hf["phonesim_random_weights"] = True
    (directory / "config.json").write_text(json.dumps(hf, indent=2), encoding="utf-8")
    return directory


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every canonical parameter (optional ones included)."""
    d, n, hd = cfg.hidden, cfg.n_neurons, cfg.head_dim
    q_out, kv_out = cfg.n_heads * hd, cfg.n_kv_heads * hd
    s: dict[str, tuple[int, ...]] = {"embed.weight": (cfg.vocab_size, d)}
    if cfg.rope_theta is None:
        s["pos_embed.weight"] = (cfg.max_positions + (2 if cfg.arch == "opt" else 0), d)
    if cfg.arch == "bert":
        s |= {"type_embed.weight": (cfg.type_vocab_size, d), "embed_norm.weight": (d,), "embed_norm.bias": (d,)}
    if cfg.causal:
        s |= {"final_norm.weight": (d,), "lm_head.weight": (cfg.vocab_size, d)}
        if cfg.norm == "layer":
            s["final_norm.bias"] = (d,)
    for i in range(cfg.n_layers):
        p = f"l{i}."
        s |= {p + "q.weight": (q_out, d), p + "k.weight": (kv_out, d), p + "v.weight": (kv_out, d),
              p + "o.weight": (d, q_out), p + "norm1.weight": (d,), p + "norm2.weight": (d,)}
        if cfg.attn_bias:
            s |= {p + "q.bias": (q_out,), p + "k.bias": (kv_out,), p + "v.bias": (kv_out,)}
            if cfg.arch in ("opt", "bert"):
                s[p + "o.bias"] = (d,)
        if cfg.norm == "layer":
            s |= {p + "norm1.bias": (d,), p + "norm2.bias": (d,)}
        experts = [f"e{e}." for e in range(cfg.n_experts)] if cfg.arch == "mixtral" else [""]
        if cfg.arch == "mixtral":
            s[p + "router.weight"] = (cfg.n_experts, d)
        for e in experts:
            s |= {p + e + "up.weight": (n, d), p + e + "down.weight": (d, n)}
            if cfg.glu:
                s[p + e + "gate.weight"] = (n, d)
            else:
                s |= {p + e + "up.bias": (n,), p + e + "down.bias": (d,)}
    return s


def check_shapes(weights: ModelWeights, src: str) -> None:
    """Raise a one-line SimError if a tensor's shape disagrees with the config."""
    cfg = weights.config
    for name, shape in expected_shapes(cfg).items():
        arr = weights.params.get(name)
        if arr is None:
            if name == "lm_head.weight" or (name == "pos_embed.weight" and cfg.arch == "opt"):
                continue  # tied to the embedding / checked below
            raise SimError(f"parameter {name} is missing", source=src)
        if name == "pos_embed.weight" and arr.shape[1] == shape[1]:
            continue  # learned position tables may be longer than max_position_embeddings
        if arr.shape != shape:
            raise SimError(f"parameter {name} has shape {arr.shape}, config implies {shape}", source=src)


# ---------------------------------------------------------------------------------------
# tiny random models for tests
# ---------------------------------------------------------------------------------------
TINY_MODELS = ("tiny-llama", "tiny-mixtral", "tiny-opt", "tiny-bert")
BYTE_VOCAB = 256 + 3  # utf-8 bytes shifted by 3: 0 pad, 1 bos, 2 eos


def tiny_config(name: str) -> ModelConfig:
    """Configs of the tiny random-weight models (ReLU-family so their sparsity is exact)."""
    base = dict(name=name, vocab_size=BYTE_VOCAB, hidden=64, n_layers=3, n_heads=4, max_positions=512,
                tokenizer="bytes")
    if name == "tiny-llama":
        return ModelConfig(arch="llama", n_kv_heads=2, head_dim=16, n_neurons=256, activation="relu", glu=True,
                           norm="rms", norm_eps=1e-6, post_norm=False, causal=True, rope_theta=10000.0, **base)
    if name == "tiny-mixtral":
        return ModelConfig(arch="mixtral", n_kv_heads=2, head_dim=16, n_neurons=128, activation="relu", glu=True,
                           norm="rms", norm_eps=1e-6, post_norm=False, causal=True, rope_theta=10000.0,
                           n_experts=4, top_k=2, **base)
    if name == "tiny-opt":
        return ModelConfig(arch="opt", n_kv_heads=4, head_dim=16, n_neurons=256, activation="relu", glu=False,
                           norm="layer", norm_eps=1e-5, post_norm=False, causal=True, tie_embeddings=True,
                           attn_bias=True, **base)
    if name == "tiny-bert":
        return ModelConfig(arch="bert", n_kv_heads=4, head_dim=16, n_neurons=256, activation="gelu", glu=False,
                           norm="layer", norm_eps=1e-12, post_norm=True, causal=False, type_vocab_size=2,
                           attn_bias=True, **base)
    raise SimError(f"unknown tiny model {name!r}; known: {list(TINY_MODELS)}", field="model")


def build_tiny(name: str, seed: int = 0, config: ModelConfig | None = None) -> ModelWeights:
    """A model with random N(0, 0.02^2)-ish weights (scaled by fan-in) for tests.

    ``config`` overrides the named tiny config (tests vary shapes this way).
    """
    cfg = config or tiny_config(name)
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for pname, shape in expected_shapes(cfg).items():
        if pname == "lm_head.weight" and cfg.tie_embeddings:
            continue
        leaf = pname.rsplit(".", 1)
        is_norm = "norm" in leaf[0]
        if is_norm and leaf[1] == "weight":
            arr = 1.0 + 0.1 * rng.standard_normal(shape)
        elif leaf[1] == "bias":
            arr = 0.02 * rng.standard_normal(shape)
        elif "embed" in pname:
            arr = rng.standard_normal(shape)
        else:
            arr = rng.standard_normal(shape) / np.sqrt(shape[-1])
        params[pname] = arr.astype(np.float32)
    return ModelWeights(replace(cfg, name=cfg.name), params, real=False, origin=f"random weights, seed {seed}")
