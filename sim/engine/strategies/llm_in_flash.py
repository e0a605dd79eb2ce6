"""LLM in a Flash [FLASH] (Alizadeh et al., arXiv 2312.11514 v3): load, then compute, per layer.

Decode, per layer, strictly one step after another (no I/O-compute overlap) [FLASH §3]:

1. attention on the CPU compute threads (its weights stay in DRAM: the "hybrid" half);
2. the low-rank predictor guesses the active FFN neurons [FLASH §3.1]
   (:meth:`~sim.engine.costs.ModelCosts.predictor`; its weights occupy DRAM);
3. the sliding window [FLASH §3.1] keeps in DRAM the neurons predicted for the last
   ``window_k`` tokens (the ``window`` cache policy over the memory plan's neuron cache);
   ``pinned_share`` of that cache may instead hold the offline profile's most active
   neurons for good (a port with a hot region, as PowerInfer-2's neuron cache has; 0, Apple's
   design, by default); only predicted neurons outside both are read, from ``io_threads`` parallel readers
   [FLASH §4], either as one read of the whole neuron bundle (row-column bundling
   [FLASH §3.2]) or as one read per matrix;
4. memory management [FLASH §3.3]: each layer's neurons live in a preallocated matrix;
   a new neuron's row is copied in and a dropped neuron's slot is filled by copying the
   last row into it. Those bytes move at the CPU's copy bandwidth (read + write), and each
   row moved in or out costs the implementation a fixed ``row_move_overhead_us`` on top
   (a framework call per move; 0 by default);
5. the FFN multiplies the layer's matrix: all rows it holds (the window's neurons) by
   default, since the matrix is kept compact precisely so the product stays dense.

Each mechanism can be switched off to rebuild [FLASH Table 2]'s I/O ladder:
``hybrid: false`` (naive) reads every weight every token; ``predictor: false`` reads the
layer's whole non-resident FFN (sequentially; the neuron-cache DRAM then holds a fixed
slice of every layer, which is what "hybrid: half of the model resident" means);
``window_k: 0`` keeps no neurons across tokens (the +predictor row: ~10% of the FFN read
per token); ``bundling: false`` reads each matrix's row separately.

With a budget that holds the whole FFN nothing is loaded and the predicted rows are
computed from resident weights. Prefill runs layer by layer: read what is not resident,
then compute.

[FLASH] runs on the CPU and on the GPU: ``decode_unit`` and ``prefill_unit`` move every
compute step (attention, predictor, the preallocated matrix's product, LM head) to the
GPU (or NPU), one call each at the unit's batch-1 (decode) or prompt-batch (prefill)
efficiency. A unit whose profile says it has no gathered-row kernels (``sparse_kernels:
false``) cannot multiply just the predicted rows picked out of resident weights (in memory,
or ``compute_rows: predicted``): it multiplies the matrix that holds them, the window's
rows, or every row of the chosen experts when the whole FFN is resident. Memory
management stays on the CPU: the rows are copied in shared DRAM before the unit reads
them (unified memory on both the M1 Max and the phones).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from numba import njit
from pydantic import Field

from sim.cache.base import MAX_TOKEN
from sim.engine.costs import Work
from sim.engine.neuron_cache import NeuronCache
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
from sim.engine.strategies.serial import Step, compute, cpu, on_unit, read, run_steps, spread_threads, steps_time_s
from sim.engine.unit_labels import accelerator
from sim.engine.workload import LayerWork, TokenWork
from sim.profiles.device import DeviceProfile

# [FLASH §4]: "we use 32 threads" to read from flash (parallel reads raise SSD throughput).
FLASH_IO_THREADS = 32

# one layer's plan: (neurons read sparsely, FFN rows multiplied, rows copied, FFN bytes read densely)
Plan = tuple[int, int, int, int]


class LlmInFlashKnobs(Knobs):
    compute_cores: list[str] | None = Field(
        None, description="compute threads, one CPU cluster name each (default: every core but a little "
                          "cluster's)")
    io_cores: list[str] | None = Field(
        None, description="reader threads, one cluster name each (default: `readers` threads spread over the "
                          "compute cores)")
    readers: int | None = Field(
        None, ge=1, le=1024, description="reader threads, each with one blocking read in flight, when io_cores is not "
                                         "given (default 32 [FLASH §4]; a port that reads synchronously from the "
                                         "compute path has about one)")
    hybrid: bool = Field(True, description="non-FFN weights stay in DRAM ([FLASH Table 2]); false: naive loading")
    predictor: bool = Field(True, description="the low-rank predictor selects the neurons to load ([FLASH §3.1])")
    window_k: int | None = Field(
        None, ge=0, le=2**16,
        description="sliding window of the last k tokens' neurons ([FLASH §4.1]: 5 for OPT-6.7B); 0: no window; "
                    "default: no expiry, so the window grows to the DRAM the budget leaves for neurons and "
                    "drops the least recently used when full (the neuron cache of [PI2]'s port, §7.1)")
    bundling: bool = Field(True, description="a neuron's up column and down row are stored and read together "
                                             "([FLASH §3.2])")
    # inferred from [FLASH §3.3]: the matrix is kept compact so the layer is one dense product
    compute_rows: Literal["window", "predicted"] = Field(
        "window", description="multiply every row the layer's matrix holds (the compact window) or only this "
                              "token's predicted rows")
    # None: assumed, [FLASH] runs on PyTorch, whose copy kernels use the intra-op thread pool
    memcpy_threads: int | None = Field(None, ge=1, le=1024, description="threads copying rows into the preallocated "
                                                               "matrix (default: every compute thread)")
    # 0 by default; each implementation's is fitted (validation/unknowns.yaml: Apple's PyTorch
    # program m1-pytorch-row-move-us, [PI2]'s port pi2-port-row-move-us)
    row_move_overhead_us: float = Field(
        0.0, ge=0, le=1e4, description="the implementation's fixed cost per row moved into or out of the "
                                       "preallocated matrix, in microseconds ([FLASH §3.3]: each insert or "
                                       "delete is a framework call, e.g. an eager PyTorch op's dispatch), paid "
                                       "serially on top of the copied bytes")
    dense_read_block_bytes: int | None = Field(
        None, ge=4096, description="request size of whole-layer reads (default: the largest block the profile "
                                   "measured)")
    policy: str = Field("window", description="the cache policy ([FLASH §3.1]: the sliding window)")
    # 0: Apple's design keeps only the window; [PI2]'s port is fitted (validation/unknowns.yaml:
    # pi2-port-pinned-share)
    pinned_share: float = Field(
        0.0, ge=0, le=0.9, description="share of the neuron cache holding the offline profile's most active "
                                       "neurons for good (a hot region, as PowerInfer-2's cache has); the "
                                       "window policy manages the rest")
    decode_unit: Unit = Field("cpu", description="where decode's products run ([FLASH] Table 3: the CPU)")
    prefill_unit: Unit = Field("cpu", description="where prefill computes")


@register
class LlmInFlash(Strategy):
    name = "llm-in-flash"
    summary = "LLM in a Flash: predictor, sliding-window cache, bundled reads, load-then-compute (CPU or GPU)"
    knobs_model = LlmInFlashKnobs
    uses_predictor = True  # [FLASH §4.1]: the predictor is 1.25% of the model, held in DRAM
    split_scales = False  # [FLASH §3.2]: a neuron's bundle is self-contained (no separate scale region)
    readers_share_compute = True  # see default_cores
    # [FLASH] Table 2's I/O ladder: naive, + hybrid, + predictor, + window, + bundling.
    mechanisms: ClassVar[dict[str, dict[str, Any]]] = {
        "hybrid": {"hybrid": False}, "predictor": {"predictor": False}, "window": {"window_k": 0},
        "bundling": {"bundling": False}}

    @classmethod
    def default_cores(cls, device: DeviceProfile, needs_io: bool = True,
                      knobs: Any = None) -> tuple[list[str], list[str]]:
        """All but a little cluster compute (nothing overlaps, so no core is kept for
        I/O); ``readers`` reader threads (32 [FLASH §4]) run round-robin on the same cores."""
        compute, _ = default_core_split(device, needs_io=False)
        return compute, spread_threads(compute, getattr(knobs, "readers", None) or FLASH_IO_THREADS)

    def __init__(self, ctx: RunContext, knobs: LlmInFlashKnobs):
        super().__init__(ctx, knobs)
        self.k = knobs
        model, plan, dev = ctx.model, ctx.plan, ctx.device
        bundle = model.bundle(ctx.dtype, dev.storage.page_bytes)
        self.row_bytes = plan.neuron_dram_bytes  # self-contained bundle (split_scales = False)
        self.packed_bytes = bundle.packed_bytes
        if knobs.bundling:
            self.reads_per_neuron, self.read_block = 1, bundle.flash_bytes
        else:
            self.reads_per_neuron, self.read_block = model.ffn_matrices, bundle.row_flash_bytes
        # Random reads land within the chosen experts' slice of the layer's flash image.
        self.span_bytes = model.top_k * model.ffn_dim * bundle.flash_bytes
        self.dense_block = knobs.dense_read_block_bytes or max(p.block for p in dev.storage.seq_read)
        self.n_groups = ctx.meta.n_layers * ctx.meta.n_experts
        self.rows = np.zeros(self.n_groups, dtype=np.int64)  # neurons held per (layer, expert) matrix
        self.last_token = -1  # last token index the window saw (the analytic mode continues from it)
        self.policy = None
        self.pinned: np.ndarray | None = None  # per key: held in the hot region for good
        # When the budget holds the whole FFN nothing is ever loaded (in-memory run): the
        # predicted rows are computed from resident weights, nothing is copied.
        self.all_resident = knobs.hybrid and plan.neuron_cache_bytes >= plan.ffn_bytes
        if knobs.predictor and knobs.window_k != 0 and not self.all_resident:
            name = ctx.policy or knobs.policy
            options = {"strict": False, "window_tokens": knobs.window_k or MAX_TOKEN}
            cache = NeuronCache(ctx.n_keys, self.row_bytes, plan.neuron_cache_bytes, ctx.popularity,
                                knobs.pinned_share, name, options, preload=False)
            self.policy = cache.policy
            if cache.hot_bytes:  # the hot rows sit in their layer's matrix from the start
                self.pinned = cache.is_hot
                self.rows += np.bincount(np.flatnonzero(cache.is_hot) // ctx.meta.n_neurons, minlength=self.n_groups)
        # Without the predictor every neuron is needed every token, so no window can save
        # reads; the neuron-cache DRAM then holds a fixed slice of each layer (hybrid).
        self.static_share = plan.ffn_resident_fraction if (knobs.hybrid and not knobs.predictor) else 0.0
        # Whether decode can multiply just the predicted rows: the CPU can; a unit without
        # gathered-row kernels multiplies the matrix that holds them instead (the window's
        # rows, or every row of the chosen experts when all are resident).
        unit = accelerator(dev, knobs.decode_unit)  # None: the CPU (check_options refuses a missing unit)
        self.gathers = unit is None or unit.sparse_kernels

    def warm_token(self, t: int, layers: list[LayerWork], stats: TokenStats) -> None:
        self._token_plan(layers, t, stats)

    # -- per-token plan (shared by warm-up, DES and analytic) -------------------------------
    def _token_plan(self, layers: Sequence[LayerWork], t: int, stats: TokenStats) -> list[Plan]:
        """Per layer: (neurons read sparsely, FFN rows multiplied, rows copied, FFN bytes read
        densely). The window moves layer by layer, one step a layer; nothing else touches it
        between a token's layers, so the token's steps go to the policy in one call."""
        model = self.ctx.model
        self.last_token = max(self.last_token, t)
        if not self.k.predictor:
            n = model.top_k * model.ffn_dim
            resident = int(round(self.static_share * n))
            stats.requests += n * len(layers)
            stats.hits += resident * len(layers)
            stats.misses += (n - resident) * len(layers)
            return [(0, n, 0, (n - resident) * self.packed_bytes)] * len(layers)
        work = TokenWork.from_layers(layers)
        keys, bounds = work.predicted, work.p_bounds
        sizes = np.diff(bounds)
        n_all = int(keys.size)
        stats.requests += n_all
        if self.all_resident:
            stats.hits += n_all
            dense = model.top_k * model.ffn_dim
            return [(0, int(n) if self.gathers else dense, 0, 0) for n in sizes]
        if self.policy is None:  # no window: read the whole predicted set, drop it after use
            stats.misses += n_all
            return [(int(n), int(n), int(n), 0) for n in sizes]
        if self.pinned is not None:  # the hot region always hits; the window sees the rest
            keys, bounds = _unpinned(keys, bounds, self.pinned)
        used0 = self.policy.used_bytes
        res = self.policy.run(keys, bounds, tokens=np.full(bounds.size - 1, t, dtype=np.int64),
                              record_evictions=True, check=False, per_step=True)
        assert res.evicted is not None and res.evicted_ends is not None and res.used_ends is not None
        groups = work.layer_ids[:, None] * self.ctx.meta.n_experts + work.experts
        misses, inserted, held = _book_rows(self.rows, keys, bounds, res.hit, res.evicted, res.evicted_ends,
                                            res.used_ends, used0, self.row_bytes, self.ctx.meta.n_neurons,
                                            groups.astype(np.int64))
        n_miss_all = int(misses.sum())
        stats.hits += n_all - n_miss_all
        stats.misses += n_miss_all
        evicted = np.diff(res.evicted_ends, prepend=0)
        window_rows = self.k.compute_rows == "window" or not self.gathers
        return [(int(m), int(h + m - i) if window_rows else int(n), int(i + e), 0)
                for m, i, h, e, n in zip(misses, inserted, held, evicted, sizes, strict=True)]

    # -- steps -------------------------------------------------------------------------------
    def _dense_read(self, phase: str, name: str, nbytes: float) -> Step:
        return read(phase, name, math.ceil(nbytes / self.dense_block), self.dense_block, sequential=True)

    def _layer_steps(self, plan: Plan, context_tokens: int) -> list[Step]:
        costs, dtype, k = self.ctx.costs, self.ctx.dtype, self.k
        steps = []
        attn = costs.attention(context_tokens) + costs.router()
        if not k.hybrid:
            steps.append(self._dense_read("io_s", "attention-read", costs.attention(0).weight_bytes))
        unit = k.decode_unit
        steps.append(compute(unit, "attention_s", "attention", attn.weight_bytes, attn.ops, dtype))
        if k.predictor:
            w = costs.predictor()
            steps.append(compute(unit, "predictor_s", "predictor", w.weight_bytes, w.ops,
                                 self.ctx.model.predictor.dtype))
        loaded, rows, moved, dense_bytes = plan
        if dense_bytes:
            steps.append(self._dense_read("io_s", "ffn-read", dense_bytes))
        if loaded:
            steps.append(read("io_s", "neuron-read", loaded * self.reads_per_neuron, self.read_block,
                              span_bytes=self.span_bytes))
        if moved:  # memcpy: every byte is read once and written once; each row move is one call
            steps.append(cpu("memory_management_s", "memory-management", 2 * moved * self.row_bytes, 0, dtype,
                             threads=k.memcpy_threads, overhead_s=moved * k.row_move_overhead_us * 1e-6))
        # The compact matrix is one dense product; predicted rows picked out of resident
        # weights are a gathered (sparse) product (see `gathers` for a unit that has none).
        dense = k.compute_rows == "window" and not self.all_resident
        w = costs.neurons(rows)
        steps.append(compute(unit, "ffn_s", "ffn", w.weight_bytes, w.ops, dtype,
                             kernel="dense_gemv" if dense else "sparse_gemv"))
        return steps

    def _head_steps(self, unit: str) -> list[Step]:
        w = self.ctx.costs.lm_head()
        steps = [] if self.k.hybrid else [self._dense_read("io_s", "lm-head-read", w.weight_bytes)]
        return [*steps, compute(unit, "lm_head_s", "lm_head", w.weight_bytes, w.ops, self.ctx.dtype)]

    def _token_steps(self, t: int, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> list[Step]:
        steps = [s for plan in self._token_plan(layers, t, stats) for s in self._layer_steps(plan, context_tokens)]
        return steps + self._head_steps(self.k.decode_unit)

    # -- decode / prefill / analytic -----------------------------------------------------------
    def decode_token(self, t: int, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> Event:
        # The window moves layer by layer, but nothing else touches it between a token's
        # layers, so planning them all before the first runs gives the same steps (and one
        # closed stretch a token instead of one a layer).
        yield from run_steps(self.ctx.machine, self._token_steps(t, layers, context_tokens, stats), stats)

    def analytic_token_s(self, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> float:
        t = self.last_token + 1  # analytic tokens follow the warm-up tokens, as in the DES
        return steps_time_s(self.ctx.machine, self._token_steps(t, layers, context_tokens, stats), stats)

    def prefill(self, stats: TokenStats) -> Event:
        """Prefill, per layer: read every non-resident weight of the layer, then compute (on
        ``prefill_unit``); the LM head runs for the last token, on ``decode_unit``."""
        ctx, costs, model = self.ctx, self.ctx.costs, self.ctx.model
        p = ctx.prompt_tokens
        steps: list[Step] = []
        per_layer = model.n_experts * model.ffn_dim
        for layer in range(model.n_layers):
            if not self.k.hybrid:
                steps.append(self._dense_read("io_s", "attention-read", costs.attention(0).weight_bytes))
            group = slice(layer * model.n_experts, (layer + 1) * model.n_experts)
            resident = per_layer if self.all_resident else (
                int(self.rows[group].sum()) + int(round(self.static_share * per_layer)))
            steps.append(self._dense_read("io_s", "ffn-read", max(0, per_layer - resident) * self.packed_bytes))
            attn = costs.attention(p, batch=p)
            kv_bytes = attn.weight_bytes - costs.attention(0).weight_bytes
            ops = attn.ops + costs.dense_ffn(batch=p).ops
            work = Work(costs.layer_weight_bytes() + kv_bytes, ops)
            steps += on_unit(costs, ctx.device, self.k.prefill_unit, "prefill_s", "prefill", work,
                             costs.layer_weights(), batch=p, kernel="gemm")
        steps += self._head_steps(self.k.decode_unit)
        yield from run_steps(ctx.machine, steps, stats)


# -- per-token bookkeeping, compiled: a token's layers are many short steps, where numpy's
# per-call overhead (gathers, bincounts over every (layer, expert) group, masks) cost about
# as much as the window's kernel itself ----------------------------------------------------
@njit(cache=True)
def _unpinned(keys: np.ndarray, bounds: np.ndarray, pinned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step's keys outside the hot region, in their order, and the new step bounds."""
    out = np.empty_like(keys)
    out_bounds = np.zeros_like(bounds)
    n = 0
    for s in range(bounds.shape[0] - 1):
        for i in range(bounds[s], bounds[s + 1]):
            if not pinned[keys[i]]:
                out[n] = keys[i]
                n += 1
        out_bounds[s + 1] = n
    return out[:n], out_bounds


@njit(cache=True)
def _book_rows(rows: np.ndarray, keys: np.ndarray, bounds: np.ndarray, hit: np.ndarray, evicted: np.ndarray,
               evicted_ends: np.ndarray, used_ends: np.ndarray, used0: int, row_bytes: int, neurons: int,
               groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Book each step (layer) in the rows each (layer, expert) matrix holds, in step order;
    return per step its misses, its inserted rows and the rows its layer's ``groups`` hold
    after it.

    A step's misses are inserted in key order until its pinned bytes fill the capacity (the
    first ``inserted`` of them: the growth of the resident bytes plus what it evicted); the
    rest are read, used and dropped (bypassed)."""
    n_steps = bounds.shape[0] - 1
    misses = np.zeros(n_steps, dtype=np.int64)
    inserted = np.zeros(n_steps, dtype=np.int64)
    held = np.zeros(n_steps, dtype=np.int64)
    used = used0
    ev0 = 0
    for s in range(n_steps):
        ins = (used_ends[s] - used) // row_bytes + (evicted_ends[s] - ev0)
        m = 0
        for i in range(bounds[s], bounds[s + 1]):
            if not hit[i]:
                if m < ins:
                    rows[keys[i] // neurons] += 1
                m += 1
        for j in range(ev0, evicted_ends[s]):
            rows[evicted[j] // neurons] -= 1
        h = 0
        for g in groups[s]:
            h += rows[g]
        misses[s], inserted[s], held[s] = m, ins, h
        used = used_ends[s]
        ev0 = evicted_ends[s]
    return misses, inserted, held
