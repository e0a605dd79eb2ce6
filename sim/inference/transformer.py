"""The transformer forward pass in numpy (fp32): Llama/Mistral, Mixtral, OPT and BERT.

Decoder models run causally with a KV cache, so a prompt can be prefilled as one block and
then extended one token at a time (incremental decode); the output equals running the
whole sequence at once. Encoders (BERT) process a sequence bidirectionally in one call.

The FFN of every layer goes through one place, :meth:`Transformer._ffn`, which offers two
hooks the recorder and the tests use:

- ``hook(layer, x, experts, h)`` observes the FFN input ``x`` (T, d), the experts the
  router chose (T, k) (zeros for dense models) and the neuron outputs ``h`` (T, k, N).
- ``active(layer, x, experts) -> mask (T, k, N)`` switches the FFN to the sparse kernel:
  only the masked neurons are computed, as a phone would after its predictor ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sim.errors import SimError

from .ffn import FFN, MoE, build_layer_ffn
from .weights import ModelConfig, ModelWeights

FFNHook = Callable[[int, np.ndarray, np.ndarray, np.ndarray], None]
ActiveFn = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@dataclass
class KVCache:
    """Keys and values per layer, (n_kv_heads, capacity, head_dim), grown by doubling."""

    k: list[np.ndarray] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)
    length: int = 0

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store this step's k/v (heads, T, hd) for ``layer``; return all keys/values so far."""
        n_new = k.shape[1]
        if layer == len(self.k):
            cap = max(16, n_new)
            self.k.append(np.zeros((k.shape[0], cap, k.shape[2]), np.float32))
            self.v.append(np.zeros_like(self.k[-1]))
        need = self.length + n_new
        if need > self.k[layer].shape[1]:
            cap = max(need, 2 * self.k[layer].shape[1])
            for store in (self.k, self.v):
                grown = np.zeros((k.shape[0], cap, k.shape[2]), np.float32)
                grown[:, : self.length] = store[layer][:, : self.length]
                store[layer] = grown
        self.k[layer][:, self.length:need] = k
        self.v[layer][:, self.length:need] = v
        return self.k[layer][:, :need], self.v[layer][:, :need]


class Transformer:
    """A runnable model built from :class:`ModelWeights` (FFNs converted to bundles once)."""

    def __init__(self, weights: ModelWeights):
        self.weights = weights
        self.cfg: ModelConfig = weights.config
        self.p = weights.params
        self.ffns: list[FFN | MoE] = [build_layer_ffn(self.p, i, self.cfg) for i in range(self.cfg.n_layers)]
        if self.cfg.rope_theta is not None:
            hd = self.cfg.head_dim
            self._inv_freq = 1.0 / (self.cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))

    # -- pieces -------------------------------------------------------------------------
    def _norm(self, name: str, x: np.ndarray) -> np.ndarray:
        if self.cfg.norm == "rms":
            return rms_norm(x, self.p[name + ".weight"], self.cfg.norm_eps)
        return layer_norm(x, self.p[name + ".weight"], self.p[name + ".bias"], self.cfg.norm_eps)

    def _linear(self, name: str, x: np.ndarray) -> np.ndarray:
        y = x @ self.p[name + ".weight"].T
        b = self.p.get(name + ".bias")
        return y + b if b is not None else y

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotary embedding, HF "rotate_half" convention; x is (heads, T, hd)."""
        ang = positions[:, None].astype(np.float64) * self._inv_freq[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1).astype(np.float32)
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1).astype(np.float32)
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def _attention(self, layer: int, x: np.ndarray, positions: np.ndarray, cache: KVCache | None) -> np.ndarray:
        cfg = self.cfg
        n_tok, hd = x.shape[0], cfg.head_dim
        p = f"l{layer}."
        q = self._linear(p + "q", x).reshape(n_tok, cfg.n_heads, hd).transpose(1, 0, 2)
        k = self._linear(p + "k", x).reshape(n_tok, cfg.n_kv_heads, hd).transpose(1, 0, 2)
        v = self._linear(p + "v", x).reshape(n_tok, cfg.n_kv_heads, hd).transpose(1, 0, 2)
        if cfg.rope_theta is not None:
            q, k = self._rope(q, positions), self._rope(k, positions)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        group = cfg.n_heads // cfg.n_kv_heads
        if group > 1:
            k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        scores = (q @ k.transpose(0, 2, 1)) / np.float32(np.sqrt(hd))  # a float64 scalar would widen to fp64
        if cfg.causal:
            key_pos = np.arange(k.shape[1])
            mask = key_pos[None, :] > positions[:, None]
            if cfg.sliding_window:
                mask |= key_pos[None, :] <= positions[:, None] - cfg.sliding_window
            scores = np.where(mask[None], np.float32(-np.inf), scores)
        out = (softmax(scores) @ v).transpose(1, 0, 2).reshape(n_tok, cfg.n_heads * hd)
        return self._linear(p + "o", out)

    def _ffn(self, layer: int, x: np.ndarray, hook: FFNHook | None, active: ActiveFn | None) -> np.ndarray:
        ffn = self.ffns[layer]
        if isinstance(ffn, MoE):
            experts, w = ffn.route(x)
        else:
            experts, w = np.zeros((x.shape[0], 1), np.int64), None
        masks = active(layer, x, experts) if active is not None else None
        if isinstance(ffn, MoE):
            y, h = ffn.forward(x, experts, w, masks)
        elif masks is None:
            h = ffn.intermediate(x)
            y = ffn.output(h)
            h = h[:, None, :]
        else:
            y = np.stack([ffn.sparse(x[t], np.flatnonzero(masks[t, 0])) for t in range(x.shape[0])])
            h = None
        if hook is not None:
            if h is None:
                raise SimError("an FFN hook needs the dense path (no active-set function)", field="hook")
            hook(layer, x, experts, h)
        return y

    def _block(self, layer: int, x: np.ndarray, positions: np.ndarray, cache: KVCache | None,
               hook: FFNHook | None, active: ActiveFn | None) -> np.ndarray:
        p = f"l{layer}."
        if self.cfg.post_norm:  # BERT / OPT-350m: normalise after each residual add
            x = self._norm(p + "norm1", x + self._attention(layer, x, positions, cache))
            return self._norm(p + "norm2", x + self._ffn(layer, x, hook, active))
        x = x + self._attention(layer, self._norm(p + "norm1", x), positions, cache)
        return x + self._ffn(layer, self._norm(p + "norm2", x), hook, active)

    def _embed(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
            raise SimError(f"token ids must be in [0, {cfg.vocab_size})", field="ids")
        if positions.size and positions.max() >= cfg.max_positions:
            raise SimError(f"sequence longer than the model's {cfg.max_positions} positions", field="ids")
        x = self.p["embed.weight"][ids].astype(np.float32)
        if cfg.arch == "opt":
            x = x + self.p["pos_embed.weight"][positions + 2]
        elif cfg.arch == "bert":
            x = x + self.p["pos_embed.weight"][positions] + self.p["type_embed.weight"][0]
            x = self._norm("embed_norm", x)
        return x

    # -- public -------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        return KVCache()

    def forward(self, ids: np.ndarray, cache: KVCache | None = None, *, hook: FFNHook | None = None,
                active: ActiveFn | None = None) -> np.ndarray:
        """Hidden states (T, d) for token ids (T,), after the final norm (decoders).

        For a decoder, ``cache`` carries earlier tokens: positions continue from
        ``cache.length`` and the new keys/values are appended. Encoders take no cache.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.cfg.causal and cache is None:
            cache = self.new_cache()
        if not self.cfg.causal and cache is not None:
            raise SimError("an encoder has no KV cache", field="cache")
        start = cache.length if cache is not None else 0
        positions = np.arange(start, start + ids.shape[0])
        x = self._embed(ids, positions)
        for layer in range(self.cfg.n_layers):
            x = self._block(layer, x, positions, cache, hook, active)
        if cache is not None:
            cache.length += ids.shape[0]
        if self.cfg.causal and "final_norm.weight" in self.p:
            x = self._norm("final_norm", x)
        return x.astype(np.float32, copy=False)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Next-token logits of a decoder (the LM head, tied to the embedding if absent)."""
        head = self.p.get("lm_head.weight")
        return hidden @ (head if head is not None else self.p["embed.weight"]).T
