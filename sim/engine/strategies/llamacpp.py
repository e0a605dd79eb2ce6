"""llama.cpp with a memory-mapped model: dense compute, the OS page cache as the only cache.

llama.cpp maps the model file (``mmap``) and lets the kernel page weights in on demand.
What stays in DRAM is whatever the OS page cache holds, over the file in read-ahead-sized
chunks (a fault reads ``readahead_bytes`` around the faulting page, the Linux/Android default
``read_ahead_kb = 128``), with the capacity the memory budget leaves after the runtime and the
KV cache (which are anonymous memory, not file pages). Linux does not reclaim file pages in
plain LRU order: a page enters a small inactive list and is promoted to the active list on
a second access, and a page evicted from the inactive list leaves a shadow entry, so one that
faults back in soon after (a short refault distance) goes straight to the active list
(Documentation/mm and mm/workingset.c; the inactive list is a small share of the file pages,
``inactive_ratio = sqrt(10 x GB)`` of memory, ~8% at 16 GB). S3-FIFO (a small FIFO of ~10%
feeding a main queue, with a ghost queue of recently evicted items) is the same design, so it
is the default ``policy``; a plain LRU (``policy: lru``) evicts every chunk of a sweep larger
than the cache before its reuse.

Every token touches every weight of each layer it runs: the attention block, then the
experts the router chose (all their neurons: llama.cpp does not exploit activation
sparsity), then the LM head. The file is laid out layer by layer and, within a layer,
attention first and then expert by expert, so a chunk key is the byte offset of the
weights divided by the chunk size. Faults are synchronous: the faulting compute threads
each wait for one read (of read-ahead size, sequential within the file) before they
compute, so I/O never overlaps compute. Compute runs on the CPU exactly as in
:mod:`~sim.engine.strategies.dense`, so with a budget that holds the model the two agree.
Prefill runs on the CPU too (or on the GPU or NPU: ``prefill_unit``), after faulting in
each layer's whole weights.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import Field

from sim.cache import make_policy
from sim.engine.neuron_cache import timed_policy_options
from sim.engine.strategies.base import (
    Event,
    Knobs,
    RunContext,
    Strategy,
    TokenStats,
    Unit,
    default_core_split,
    register,
)
from sim.engine.strategies.serial import Step, cpu, on_unit, read, run_steps, steps_time_s
from sim.engine.workload import LayerWork, TokenWork
from sim.profiles.device import DeviceProfile

# Linux (and Android) default read-ahead window: /sys/block/<dev>/queue/read_ahead_kb = 128.
LINUX_READAHEAD_BYTES = 128 * 1024


class LlamaCppKnobs(Knobs):
    compute_cores: list[str] | None = Field(
        None, description="compute threads, one CPU cluster name each (default: as the dense strategy)")
    io_cores: list[str] | None = Field(
        None, description="threads that fault, one cluster name each (default: the compute threads)")
    readahead_bytes: int = Field(LINUX_READAHEAD_BYTES, ge=4096, le=2**30,
                                 description="bytes a page fault reads (Linux/Android read_ahead_kb = 128)")
    policy: str = Field("s3fifo", description="the page cache's policy (Linux's inactive/active lists with "
                                              "refault shadow entries, as S3-FIFO's small, main and ghost "
                                              "queues; lru: a plain LRU)")
    prefill_unit: Unit = Field("cpu", description="where prefill computes (llama.cpp's CPU backend)")


class FileLayout:
    """Byte ranges of the model file in chunks: input embeddings, then per layer the
    attention block and each expert's FFN, then the LM head (GGUF-like order)."""

    def __init__(self, ctx: RunContext, chunk_bytes: int):
        model, costs = ctx.model, ctx.costs
        fmt = costs.fmt
        self.chunk = chunk_bytes
        offset = 0

        def segment(nbytes: float) -> np.ndarray:
            nonlocal offset
            start, offset = offset, offset + int(math.ceil(nbytes))
            return np.arange(start // chunk_bytes, (max(offset, start + 1) - 1) // chunk_bytes + 1, dtype=np.int64)

        vocab_bytes = fmt.packed_bytes(model.vocab * model.hidden)
        embeddings = segment(vocab_bytes)
        fp16_norms = 2 * model.hidden * 2  # two fp16 norms per layer, stored with the attention
        attn_bytes = costs.attention(0).weight_bytes + fp16_norms + costs.router().weight_bytes
        expert_bytes = costs.neurons(model.ffn_dim).weight_bytes
        self.attention: list[np.ndarray] = []
        self.experts: list[list[np.ndarray]] = []
        for _ in range(model.n_layers):
            self.attention.append(segment(attn_bytes))
            self.experts.append([segment(expert_bytes) for _ in range(model.n_experts)])
        self.lm_head = embeddings if model.tied_embeddings else segment(vocab_bytes)
        self._union: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        self.n_keys = -(-offset // chunk_bytes)
        self.file_bytes = offset

    def layer_experts(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """Chunks of the chosen experts (neighbours may share a boundary chunk)."""
        chosen = tuple(sorted(int(e) for e in experts))
        key = (layer, chosen)
        keys = self._union.get(key)
        if keys is None:  # a layer has few expert combinations: each union is computed once
            parts = [self.experts[layer][e] for e in chosen]
            keys = _sorted_union(parts) if len(parts) > 1 else parts[0]
            self._union[key] = keys
        return keys

    def whole_layer(self, layer: int) -> np.ndarray:
        key = (layer, ())
        if key not in self._union:
            self._union[key] = _sorted_union([self.attention[layer], *self.experts[layer]])
        return self._union[key]


def _sorted_union(parts: list[np.ndarray]) -> np.ndarray:
    """The union of chunk ranges given in file order (each ascending, a neighbour sharing at most
    its boundary chunk): their concatenation without repeats, in one pass where np.unique would
    hash or sort (a third of a llama.cpp sweep point's time went there)."""
    keys = np.concatenate(parts)
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))]


@register
class LlamaCpp(Strategy):
    name = "llamacpp"
    summary = "llama.cpp with mmap: dense CPU compute, OS page cache (LRU), synchronous page faults"
    knobs_model = LlamaCppKnobs
    uses_predictor = False
    split_scales = False
    readers_share_compute = True  # see default_cores

    @classmethod
    def default_cores(cls, device: DeviceProfile, needs_io: bool = True,
                      knobs: Any = None) -> tuple[list[str], list[str]]:
        """Compute as the dense strategy with the model in DRAM (no core kept for I/O): the
        compute threads themselves take the page faults."""
        compute, _ = default_core_split(device, needs_io=False)
        return compute, list(compute)

    def __init__(self, ctx: RunContext, knobs: LlamaCppKnobs):
        super().__init__(ctx, knobs)
        self.k = knobs
        self.layout = FileLayout(ctx, knobs.readahead_bytes)
        plan = ctx.plan
        anonymous = plan.resident.get("kv_cache", 0) + plan.resident.get("runtime", 0)
        self.capacity_bytes = max(0, plan.budget_bytes - anonymous)
        self.last_token = -1  # last token index the page cache saw (the analytic mode continues from it)
        self.prefilled = False  # whether the prompt's faults went through the page cache
        name = ctx.policy or knobs.policy
        self.cache = make_policy(name, capacity_bytes=self.capacity_bytes, n_items=self.layout.n_keys,
                                 item_bytes=knobs.readahead_bytes, strict=False, **timed_policy_options(name, None))

    def warm_token(self, t: int, layers: list[LayerWork], stats: TokenStats) -> None:
        self._token_faults(t, layers, stats)

    # -- page cache ------------------------------------------------------------------------
    def _serve(self, parts: list[np.ndarray], t: int, stats: TokenStats) -> list[int]:
        """Access each part's chunks in turn, in one call into the page cache; per part how many
        fault (are read from flash).

        Each chunk is its own cache step: the threads stream a matrix in file order, so a
        chunk faulted early in a layer may evict one the same layer needs later (a whole
        layer as one pinned step would wrongly keep the tail of a cyclic sweep resident).
        """
        keys = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        steps = np.arange(keys.size + 1, dtype=np.int64)
        hit = self.cache.run(keys, steps, tokens=np.full(keys.size, max(t, 0), dtype=np.int64), check=False).hit
        missed = np.concatenate(([0], np.cumsum(~hit)))[np.cumsum([0, *(p.size for p in parts)])]
        misses = np.diff(missed).tolist()
        n_miss = int(sum(misses))
        stats.requests += int(keys.size)
        stats.hits += int(keys.size) - n_miss
        stats.misses += n_miss
        return misses

    def _token_faults(self, t: int, layers: list[LayerWork], stats: TokenStats) -> tuple[list[int], list[int], int]:
        """A token's faults, in one call into the page cache: per layer the attention's and the
        chosen experts', then the LM head's after the last layer (a call per layer and matrix,
        ~65 a token, was most of a sweep point's time outside the cache kernel)."""
        lay = self.layout
        self.last_token = max(self.last_token, t)
        last = self.ctx.model.n_layers - 1
        work = TokenWork.from_layers(layers)  # the layers and their experts (no neuron ids gathered)
        layer_ids = work.layer_ids.tolist()
        parts: list[np.ndarray] = []
        for layer, experts in zip(layer_ids, work.experts, strict=True):  # in file order; the LM head last
            parts += [lay.attention[layer], lay.layer_experts(layer, experts)]
            if layer == last:
                parts.append(lay.lm_head)
        misses = self._serve(parts, t, stats)
        attn, ffn, head, i = [], [], 0, 0
        for layer in layer_ids:
            attn.append(misses[i])
            ffn.append(misses[i + 1])
            i += 2
            if layer == last:
                head, i = head + misses[i], i + 1
        return attn, ffn, head

    def _fault(self, n: int) -> Step:
        return read("io_s", "page-fault", n, self.k.readahead_bytes, sequential=True)

    def _token_steps(self, t: int, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> list[Step]:
        costs, dtype = self.ctx.costs, self.ctx.dtype
        steps: list[Step] = []
        attn, ffn, head_faults = self._token_faults(t, layers, stats)
        for attn_faults, ffn_faults in zip(attn, ffn, strict=True):
            w = costs.attention(context_tokens) + costs.router()
            steps += [self._fault(attn_faults), cpu("attention_s", "attention", w.weight_bytes, w.ops, dtype)]
            w = costs.dense_ffn()
            steps += [self._fault(ffn_faults), cpu("ffn_s", "ffn", w.weight_bytes, w.ops, dtype)]
        w = costs.lm_head()
        return [*steps, self._fault(head_faults), cpu("lm_head_s", "lm_head", w.weight_bytes, w.ops, dtype)]

    # -- decode / prefill / analytic ---------------------------------------------------------
    def decode_token(self, t: int, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> Event:
        yield from run_steps(self.ctx.machine, self._token_steps(t, layers, context_tokens, stats), stats)

    def analytic_token_s(self, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> float:
        t = self.last_token + 1  # analytic tokens follow the warm-up tokens, as in the DES
        if not self.prefilled:  # the DES faults the prompt's pages in before the first token: so does this
            self._prefill_faults(TokenStats())
        return steps_time_s(self.ctx.machine, self._token_steps(t, layers, context_tokens, stats), stats)

    def _prefill_faults(self, stats: TokenStats) -> list[int]:
        """Fault in each layer's whole weights (the prompt's tokens use every expert), then the LM
        head: per layer, then the head, how many chunks came from flash. A stateful page cache
        (S3-FIFO's queues) remembers this sweep, so the analytic mode makes it too."""
        self.prefilled = True
        parts = [self.layout.whole_layer(layer) for layer in range(self.ctx.model.n_layers)]
        return self._serve([*parts, self.layout.lm_head], -1, stats)

    def prefill(self, stats: TokenStats) -> Event:
        """Fault in each layer's whole weights, compute; then the LM head."""
        ctx, costs = self.ctx, self.ctx.costs
        p, dtype = ctx.prompt_tokens, ctx.dtype
        *layer_faults, head_faults = self._prefill_faults(stats)
        steps: list[Step] = []
        for faults in layer_faults:
            w = costs.attention(p, batch=p) + costs.dense_ffn(batch=p)
            steps += [self._fault(faults), *on_unit(costs, ctx.device, self.knobs.prefill_unit, "prefill_s", "prefill",
                                                    w, costs.dense_layer_weights(), batch=p, kernel="gemm")]
        w = costs.lm_head()
        steps += [self._fault(head_faults), cpu("lm_head_s", "lm_head", w.weight_bytes, w.ops, dtype)]
        yield from run_steps(ctx.machine, steps, stats)
