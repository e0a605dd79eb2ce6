"""PowerInfer-2 [PI2]: neuron clusters on CPU and NPU, segmented cache, I/O-compute pipeline.

Decode, per layer [PI2 §4-5]:

1. attention and the router run on the CPU compute threads (a barrier phase);
2. the low-rank predictors of the chosen experts guess the active neurons;
3. the hottest neurons of each chosen expert (those covering ``npu_activation_share`` of
   its activations in the offline profile) run densely on the NPU, as at batch 1 in the
   paper (or on the GPU: ``hot_unit``); the remaining predicted neurons run sparsely on
   the CPU as neuron clusters;
4. each CPU cluster goes through the 5-stage pipeline: Gate read (missing neurons only),
   Gate compute, Up/Down read (only neurons whose gate fired, i.e. truly active), Up/Down
   compute. One I/O thread serves reads in arrival order while the compute threads run
   other clusters; resident clusters are scheduled first so compute starts at once.

Prefill runs on the NPU over all prompt tokens, one layer at a time, while a big core
prefetches the next layer's non-resident FFN weights with large sequential reads
(``prefill_unit`` moves it to the GPU or the CPU; a phone without an NPU prefills on the CPU).

Each mechanism [PI2] §7.5's ablation adds to its CPU baseline can be switched off, so `sim
ablate` can replay that ladder on any phone: ``bundle`` (bundled Gate/Up/Down rows),
``neuron_cache`` (the segmented cache; off, a static resident set), ``pipeline`` (the
cluster pipeline; off, each stage's reads complete before its compute, in simpy processes
only) and ``xpu`` (the accelerator's share; off, the CPU does all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from sim.engine.cluster_schedule import schedule_ffn_phase, schedule_token
from sim.engine.costs import Work, affine_in_count
from sim.engine.neuron_cache import NeuronCache, plan_policies
from sim.engine.scheduler import placement_flags, route_neurons, split_clusters, top_share
from sim.engine.strategies import powerinfer2_curve
from sim.engine.strategies.base import Event, Knobs, RunContext, Strategy, TokenStats, Unit, register
from sim.engine.strategies.search import Family, core_layouts
from sim.engine.unit_labels import accelerator
from sim.engine.workload import LayerWork, TokenWork
from sim.hw.processors import accel_kernel_time_s, cpu_rate_gops
from sim.profiles.device import DeviceProfile

CONVERT_TILES = 8  # pieces a layer's weights are converted in for the prefill's accelerator


class PowerInfer2Knobs(Knobs):
    compute_cores: list[str] | None = Field(
        None, description="compute threads, one CPU cluster name each (default: every core but a little "
                          "cluster's and the I/O core)")
    io_cores: list[str] | None = Field(None, description="I/O threads, one cluster name each ([PI2 §5]: one)")
    cluster_neurons: int = Field(512, ge=1, le=2**20, description="neurons per CPU cluster ([PI2 §4.2]: 512 x 4096)")
    npu_activation_share: float = Field(
        0.5, ge=0, le=1, description="share of each expert's offline activations its hottest neurons cover, run "
                                     "densely on the accelerator ([PI2 §4.2]: half at batch 1)")
    hot_unit: Literal["npu", "gpu"] | None = Field(
        None, description="the accelerator for that share (default: the NPU, or the CPU alone on a phone "
                          "without one)")
    hot_share: float = Field(0.5, ge=0, le=1, description="share of the neuron cache pinned as the hot region")
    policy: str = Field("lru", description="the cold region's cache policy ([PI2 §4.3]: neuron-level LRU)")
    split_gate_read: bool = Field(
        True, description="read Gate rows first and Up/Down only for neurons whose gate fired ([PI2 §4.4])")
    prefill_on_npu: bool = Field(True, description="prefill on the NPU ([PI2 §4.1]); false: on the CPU unless "
                                                   "prefill_unit names a unit")
    prefill_unit: Unit | None = Field(None, description="where prefill computes (default: the NPU when "
                                                        "prefill_on_npu and the phone has one, else the CPU)")
    prefill_block_bytes: int = Field(512 * 1024, ge=4096, le=2**30,
                                     description="request size of the prefill's sequential prefetch reads")
    # The mechanisms [PI2] §7.5's ablation (Fig. 14) adds one by one; `sim ablate` switches them.
    bundle: bool = Field(True, description="a neuron's Gate, Up and Down rows stored together on flash and read "
                                           "as one bundle ([PI2 §4.4]); false: each matrix's row is a request of "
                                           "its own, from that matrix's region")
    neuron_cache: bool = Field(True, description="the segmented neuron cache: pinned hot region plus a policy-"
                                                 "managed cold region ([PI2 §4.3]); false: no dynamic cache, a "
                                                 "static resident set of the budget's size (the offline profile's "
                                                 "hottest neurons), the rest read each token it is needed")
    pipeline: bool = Field(True, description="the neuron-cluster pipeline overlaps each cluster's flash reads "
                                             "with other clusters' compute ([PI2 §4-5]); false: every cluster's "
                                             "reads of a stage complete before that stage's compute starts, so "
                                             "no read overlaps compute")
    xpu: bool = Field(True, description="CPU and accelerator together: the NPU (or hot_unit) computes the hot "
                                        "share and prefills ([PI2 §4.1-4.2]); false: the CPU does all")

    @field_validator("hot_unit", mode="before")
    @classmethod
    def _accelerator_only(cls, unit: object) -> object:
        if unit == "cpu":
            raise ValueError("the hot share runs on an accelerator (npu or gpu); npu_activation_share=0 leaves "
                             "every neuron to the CPU")
        return unit

    @field_validator("prefill_unit")
    @classmethod
    def _one_prefill_unit(cls, unit: str | None, info: ValidationInfo) -> str | None:
        if unit == "npu" and info.data.get("prefill_on_npu") is False:  # declared first, so already checked
            raise ValueError("prefill_on_npu: false contradicts prefill_unit: npu; set only prefill_unit")
        return unit

    @field_validator("xpu")
    @classmethod
    def _cpu_alone(cls, xpu: bool, info: ValidationInfo) -> bool:
        for name in ("hot_unit", "prefill_unit"):  # declared first, so already checked
            unit = info.data.get(name)
            if not xpu and unit in ("npu", "gpu"):
                raise ValueError(f"false runs everything on the CPU, which contradicts {name}: {unit}; set one")
        return xpu


@dataclass(frozen=True)
class TokenPlan:
    """A token's FFN work as the scheduler split it: per layer the NPU's neuron count, and
    per cluster (layer ``i``'s are ``[bounds[i], bounds[i + 1])``) its neurons, how many
    fired, Gate misses and Up/Down misses."""

    n_npu: list[float]
    bounds: np.ndarray
    arrays: tuple[np.ndarray, ...]

    def clusters(self, i: int) -> tuple[np.ndarray, ...]:
        return tuple(a[self.bounds[i]:self.bounds[i + 1]] for a in self.arrays)


@register
class PowerInfer2(Strategy):
    name = "powerinfer2"
    summary = "PowerInfer-2: hot neurons on NPU, cold neuron clusters on CPU, pipelined flash I/O"
    knobs_model = PowerInfer2Knobs
    keeps_profile = True  # [PI2 §4.2]: the offline profile picks the hot neurons
    mechanisms: ClassVar[dict[str, dict[str, Any]]] = {  # [PI2] §7.5, Fig. 14, in its order
        name: {name: False} for name in ("bundle", "neuron_cache", "pipeline", "xpu")}

    def __init__(self, ctx: RunContext, knobs: PowerInfer2Knobs):
        super().__init__(ctx, knobs)
        self.k = knobs
        # The accelerator that runs the hot share densely ("npu" in names below). A phone
        # without an NPU runs everything on the CPU; a GPU named by the knob must exist
        # (check_options refuses it otherwise).
        self.hot_unit = knobs.hot_unit or "npu"
        self.use_npu = self._runs_hot_share(ctx.device, knobs)
        bundle = ctx.model.bundle(ctx.dtype, ctx.device.storage.page_bytes)
        self.bundle = bundle
        gated = ctx.model.ffn_gated and knobs.split_gate_read
        self.gate_block = bundle.gate_flash_bytes if gated else bundle.flash_bytes
        self.ud_block = bundle.up_down_flash_bytes if gated else 0
        self.gate_rows = self.ud_rows = 1  # requests per missing neuron in each read
        if not knobs.bundle:  # one request per matrix row, each padded to whole pages
            n = ctx.model.ffn_matrices
            self.gate_block, self.ud_block = bundle.row_flash_bytes, bundle.row_flash_bytes if gated else 0
            self.gate_rows, self.ud_rows = (1, n - 1) if gated else (n, 0)
        # Random reads land within the chosen experts' slice of the flash image.
        self.span_bytes = ctx.model.top_k * ctx.model.ffn_dim * bundle.flash_bytes
        self._threads: tuple[np.ndarray, np.ndarray, float, float] | None = None
        self._gbps: dict[int, float] = {}
        self._npu_jobs: dict[float, tuple[float, float]] = {}  # see _npu_job
        self._epoch = np.zeros(1, dtype=np.int64)  # route_neurons' call number (its active-set marks)

    @staticmethod
    def _runs_hot_share(device: Any, knobs: PowerInfer2Knobs) -> bool:
        return (knobs.xpu and accelerator(device, knobs.hot_unit or "npu") is not None
                and knobs.npu_activation_share > 0)

    @classmethod
    def analytic_plan_key(cls, setup: Any) -> tuple:
        """What :meth:`analytic_plan` depends on besides the trace and the run's token counts."""
        knobs, plan = setup.knobs, setup.plan
        use_npu = cls._runs_hot_share(setup.device, knobs)
        return (plan.neuron_cache_bytes, plan.neuron_dram_bytes, knobs.hot_share, setup.config.policy or knobs.policy,
                use_npu, knobs.npu_activation_share if use_npu else None, knobs.cluster_neurons, knobs.neuron_cache,
                knobs.bundle, knobs.split_gate_read)

    @classmethod
    def budget_curve_key(cls, setup: Any) -> tuple | None:
        """The one-pass answer across budgets (:mod:`.powerinfer2_curve`) holds for a neuron cache
        whose cold region is a policy that recency alone decides; it depends on the NPU's share."""
        from sim.cache import policy_class

        knobs = setup.knobs
        if not knobs.neuron_cache or not policy_class(setup.config.policy or knobs.policy).pinned_curve:
            return None
        use_npu = cls._runs_hot_share(setup.device, knobs)
        return (use_npu, knobs.npu_activation_share if use_npu else None)

    def budget_curve(self, tokens: Any, warmup_tokens: int) -> Any:
        return powerinfer2_curve.build(self, tokens, warmup_tokens)

    def budget_plans(self, curve: Any) -> list[TokenPlan]:
        n_npu, cols = powerinfer2_curve.plan_columns(self, curve)
        bounds = np.arange(n_npu.shape[1] + 1)  # one cluster a layer: the analytic costs add them up
        return [TokenPlan(n_npu[t].tolist(), bounds, tuple(c[t] for c in cols)) for t in range(n_npu.shape[0])]

    # The cache and the placement tables are built on first use: a strategy made only for the
    # analytic costs (sim.engine.reevaluate, plans kept from an earlier run) never needs them.
    @cached_property
    def cache(self) -> NeuronCache:
        ctx, plan = self.ctx, self.ctx.plan
        return NeuronCache(ctx.n_keys, plan.neuron_dram_bytes, plan.neuron_cache_bytes, ctx.popularity,
                           self.k.hot_share, ctx.policy or self.k.policy, static=not self.k.neuron_cache)

    @cached_property
    def _placement(self) -> tuple[np.ndarray | None, np.ndarray]:
        """Neurons the NPU computes per (layer, expert), and what route_neurons reads per neuron."""
        is_npu, npu_count = self._npu_set() if self.use_npu else (None, None)
        return npu_count, placement_flags(self.cache.is_hot, is_npu)

    def _npu_set(self) -> tuple[np.ndarray, np.ndarray]:
        """Per (layer, expert): hot neurons covering the NPU's share of activations."""
        meta, pop = self.ctx.meta, self.ctx.popularity
        per = pop.reshape(meta.n_layers * meta.n_experts, meta.n_neurons)
        is_npu = top_share(per, self.k.npu_activation_share).reshape(-1)
        is_npu &= self.cache.is_hot  # the NPU computes resident neurons only
        counts = is_npu.reshape(meta.n_layers, meta.n_experts, meta.n_neurons).sum(axis=2)
        return is_npu, counts

    def warm_token(self, t: int, layers: list[LayerWork], stats: TokenStats) -> None:
        self._token_plan(layers, t, stats)

    # -- per-token plan (shared by DES and analytic) ---------------------------------------
    def _token_plan(self, layers: Sequence[LayerWork], t: int, stats: TokenStats) -> TokenPlan:
        """Per layer of a token its NPU neurons and its clusters (neurons, fired, gate misses,
        up/down misses), with one cache call for all layers.

        Nothing else touches the cache between a token's layers, so serving the layers'
        steps together gives the same hits as serving each when its FFN phase starts.
        """
        work = TokenWork.from_layers(layers)
        n = len(work)
        npu_count, flags = self._placement
        n_predicted, offsets, fired, hot, cold, cold_offsets = route_neurons(*work.key_rows(), flags, self._epoch)
        if self.use_npu:
            n_npu = npu_count[work.layer_ids[:, None], work.experts].sum(axis=1).astype(float).tolist()
        else:
            n_npu = [0.0] * n
        hit = self.cache.cold_hits(cold, cold_offsets, t)
        cold_hits = int(np.count_nonzero(hit))
        stats.requests += n_predicted
        stats.hits += n_predicted - int(cold.size) + cold_hits
        stats.misses += int(cold.size) - cold_hits
        bounds, *arrays = split_clusters(hot, hit, fired, offsets, cold_offsets, self.k.cluster_neurons)
        return TokenPlan(n_npu, bounds, tuple(arrays))

    def _cluster_reads(self, gate_miss, ud_miss):  # ints or arrays of them
        """(gate-read requests, up/down-read requests) for clusters' missing neurons."""
        if self.ud_block:
            return gate_miss * self.gate_rows, ud_miss * self.ud_rows
        return gate_miss * self.gate_rows, 0 * gate_miss

    # -- decode --------------------------------------------------------------------------
    def decode_token(self, t: int, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> Event:
        m, costs, env = self.ctx.machine, self.ctx.costs, self.ctx.machine.env
        dtype = self.ctx.dtype
        plan = self._token_plan(layers, t, stats)
        if self._compiled_phase() and m.closed():
            yield env.timeout(m.delay_until(self._closed_token(plan, context_tokens, stats)))
            return
        for i, n_npu in enumerate(plan.n_npu):
            clusters = plan.clusters(i)
            t0 = env.now
            yield from m.cpu_parallel("attention", *_wo(costs.attention(context_tokens) + costs.router()), dtype)
            t1 = env.now
            yield from m.cpu_parallel("predictor", *_wo(costs.predictor()), self.ctx.model.predictor.dtype)
            t2 = env.now
            if self._compiled_phase():
                yield from self._ffn_phase(n_npu, clusters, stats)
            elif not self.k.pipeline:
                yield from self._staged_ffn(n_npu, clusters, stats)
            else:
                procs = []
                if n_npu:
                    npu_work = costs.neurons(n_npu)
                    procs.append(env.process(m.accel_job(self.hot_unit, "ffn-hot", npu_work.weight_bytes,
                                                         npu_work.ops, dtype)))
                for n, n_fired, gate_miss, ud_miss in zip(*(a.tolist() for a in clusters), strict=True):
                    procs.append(env.process(self._cluster(n, n_fired, gate_miss, ud_miss, stats)))
                if procs:
                    yield env.all_of(procs)
            stats.add_phase("attention_s", t1 - t0)
            stats.add_phase("predictor_s", t2 - t1)
            stats.add_phase("ffn_s", env.now - t2)
        t3 = env.now
        yield from m.cpu_parallel("lm_head", *_wo(costs.lm_head()), dtype)
        stats.add_phase("lm_head_s", env.now - t3)

    def _compiled_phase(self) -> bool:
        """Whether the FFN phase can be scheduled in one call (:mod:`sim.engine.cluster_schedule`).

        It covers PowerInfer-2's own configuration, one I/O thread on a single-queue
        device, pipelined; timelines (which record every cluster), other set-ups and the
        phase without the pipeline (:meth:`_staged_ffn`) run simpy processes.
        """
        m = self.ctx.machine
        return (m.compiled_phases and not m.record_spans and len(m.io_threads) == 1
                and m.storage.capacity == 1 and self.k.pipeline)

    def _closed_token(self, plan: TokenPlan, context_tokens: int, stats: TokenStats) -> float:
        """A whole decode token when nothing else runs (:meth:`Machine.closed`): its phases
        follow one another, so one compiled call (:func:`schedule_token`) adds their lengths
        on a local clock exactly as the simpy clock would; busy seconds, traffic and phase
        times are booked in the order the per-phase path books them (that path is the
        reference; a test runs both ways). Returns the time the token ends."""
        m, costs, dtype = self.ctx.machine, self.ctx.costs, self.ctx.dtype
        attention = _wo(costs.attention(context_tokens) + costs.router())
        predictor = _wo(costs.predictor())
        head = _wo(costs.lm_head())
        attention_s = m.barrier_s(*attention, dtype)
        predictor_s = m.barrier_s(*predictor, self.ctx.model.predictor.dtype)
        head_s = m.barrier_s(*head, dtype)
        npu = [self._npu_job(n) for n in plan.n_npu]
        gate_reads, ud_reads, job_bytes, job_ops, has_ud = self._cluster_jobs(plan.arrays)
        n_gate, n_ud = int(gate_reads.sum()), int(ud_reads.sum())
        rate, mem, alone, with_npu = self._thread_table()
        names = [th.name for th in m.threads_by_speed]
        thread_busy = m.busy_table(names)
        layer_out = np.empty((len(npu), 5))
        end, head_d = schedule_token(
            m.env.now, attention_s, predictor_s, head_s, np.array([d for d, _ in npu], dtype=float), plan.bounds,
            gate_reads, ud_reads, job_bytes, job_ops, has_ud, rate, mem, alone, with_npu, m.flash.latency_s,
            float(self.gate_block), self._read_gbps(self.gate_block) if n_gate else 1.0, float(self.ud_block),
            self._read_gbps(self.ud_block) if n_ud else 1.0, thread_busy, layer_out)
        m.store_busy(names, thread_busy)
        reads = np.concatenate(([0], np.cumsum(gate_reads + ud_reads)))[plan.bounds]
        io_name = m.io_threads[0].name if m.io_threads else ""
        for (attn_d, pred_d, ffn_d, io_busy, ffn_bytes), (npu_d, npu_bytes), layer_reads in zip(
                layer_out.tolist(), npu, np.diff(reads).tolist(), strict=True):
            m.book_dram(attention[0])
            m.book_dram(predictor[0])
            if npu_d:
                m.book_busy(self.hot_unit, npu_d)
                m.book_dram(npu_bytes)
            m.book_dram(ffn_bytes)
            if layer_reads:
                m.book_busy("storage", io_busy)
                m.book_busy(io_name, io_busy)
            stats.add_phase("attention_s", attn_d)
            stats.add_phase("predictor_s", pred_d)
            stats.add_phase("ffn_s", ffn_d)
        self._book_reads(n_gate, n_ud, stats)
        m.book_dram(head[0])
        stats.add_phase("lm_head_s", head_d)
        return end

    def _npu_job(self, n_npu: float) -> tuple[float, float]:
        """(seconds, weight bytes) of the NPU's dense job over ``n_npu`` hot neurons, started
        while no CPU job runs; (0, 0) for none. Remembered: few distinct counts recur."""
        if not n_npu:
            return 0.0, 0.0
        job = self._npu_jobs.get(n_npu)
        if job is None:
            w = self.ctx.costs.neurons(n_npu)
            unit = self.hot_unit
            d = self.ctx.machine.accel_time_s(unit, w.weight_bytes, w.ops, self.ctx.dtype, frozenset({unit}))
            job = self._npu_jobs[n_npu] = (d, w.weight_bytes)
        return job

    def _ffn_phase(self, n_npu: float, clusters: tuple[np.ndarray, ...], stats: TokenStats) -> Event:
        """The layer's FFN phase as one simpy event: NPU job and CPU clusters, scheduled at once."""
        m = self.ctx.machine
        yield m.env.timeout(m.delay_until(self._ffn_schedule(m.env.now, n_npu, self._cluster_jobs(clusters), stats)))

    def _cluster_jobs(self, clusters: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """Per cluster: Gate reads, Up/Down reads, (Gate, Up/Down) weight bytes and ops, and
        whether it has Up/Down work; elementwise, so a token's arrays slice into its layers'."""
        costs, model = self.ctx.costs, self.ctx.model
        n, fired, gate_miss, ud_miss = clusters
        gate_reads, ud_reads = self._cluster_reads(gate_miss, ud_miss)
        gate_w = costs.neurons(n, 1)
        ud_w = costs.neurons(fired, model.ffn_matrices - 1)
        job_bytes = np.stack((np.asarray(gate_w.weight_bytes, dtype=float), np.asarray(ud_w.weight_bytes, float)), 1)
        job_ops = np.stack((np.asarray(gate_w.ops, dtype=float), np.asarray(ud_w.ops, dtype=float)), 1)
        return gate_reads, ud_reads, job_bytes, job_ops, fired > 0

    def _ffn_schedule(self, now: float, n_npu: float, jobs: tuple[np.ndarray, ...], stats: TokenStats) -> float:
        """Schedule the FFN phase starting at ``now`` (:mod:`sim.engine.cluster_schedule`), account
        its busy time and traffic, and return when it ends."""
        m = self.ctx.machine
        npu_end = now
        if n_npu:  # started first, while no CPU job runs (as the per-cluster processes do)
            d, npu_bytes = self._npu_job(n_npu)
            npu_end = now + d
            m.book_busy(self.hot_unit, d)
            m.book_dram(npu_bytes)
        gate_reads, ud_reads, job_bytes, job_ops, has_ud = jobs
        rate, mem, alone, with_npu = self._thread_table()
        busy = np.zeros(rate.shape[0])
        io_busy = np.zeros(1)
        n_gate, n_ud = int(gate_reads.sum()), int(ud_reads.sum())
        gate_gbps = self._read_gbps(self.gate_block) if n_gate else 1.0
        ud_gbps = self._read_gbps(self.ud_block) if n_ud else 1.0
        end = schedule_ffn_phase(now, gate_reads, ud_reads, job_bytes, job_ops, has_ud, rate, mem, alone, with_npu,
                                 npu_end, m.flash.latency_s, float(self.gate_block), gate_gbps,
                                 float(self.ud_block), ud_gbps, busy, io_busy)
        for th, seconds in zip(m.threads_by_speed, busy.tolist(), strict=True):
            if seconds:
                m.book_busy(th.name, seconds)
        m.book_dram(float(job_bytes[:, 0].sum() + job_bytes[has_ud, 1].sum()))
        if n_gate or n_ud:
            self._book_reads(n_gate, n_ud, stats)
            m.book_busy("storage", float(io_busy[0]))
            m.book_busy(m.io_threads[0].name, float(io_busy[0]))
        return end

    def _book_reads(self, n_gate: int, n_ud: int, stats: TokenStats) -> None:
        """Book Gate and Up/Down read requests as flash traffic (the token's and the run's)."""
        flash = n_gate * self.gate_block + n_ud * self.ud_block
        stats.flash_bytes += flash
        self.ctx.machine.book_flash(flash, n_gate + n_ud)

    def _thread_table(self) -> tuple[np.ndarray, np.ndarray, float, float]:
        """Per compute thread (fastest first) its rate and reach; the CPU's DRAM figure
        alone and next to the NPU."""
        if self._threads is None:
            m = self.ctx.machine
            rate = np.array([cpu_rate_gops(th.core, self.ctx.dtype, "sparse_gemv") for th in m.threads_by_speed])
            mem = np.array([th.core.mem_gbps for th in m.threads_by_speed])
            alone = m.dram.agent_gbps("cpu", frozenset({"cpu"}))
            with_npu = m.dram.agent_gbps("cpu", frozenset({"cpu", self.hot_unit})) if self.use_npu else alone
            self._threads = (rate, mem, alone, with_npu)
        return self._threads

    def _read_gbps(self, block: int) -> float:
        """The I/O thread's throughput for this strategy's random reads of ``block`` bytes."""
        if block not in self._gbps:
            m = self.ctx.machine
            self._gbps[block] = m.flash.throughput_gbps(block, m.io_threads[0].core, span_bytes=self.span_bytes)
        return self._gbps[block]

    def _staged_ffn(self, n_npu: float, clusters: tuple[np.ndarray, ...], stats: TokenStats) -> Event:
        """The FFN phase without the pipeline (``pipeline: false``): the clusters' Gate reads,
        then the Gate compute (with the NPU's job), then the Up/Down reads, then the Up/Down
        compute, each stage waiting for the whole previous one, so no read overlaps compute.
        Reads keep the pipeline's per-cluster batches, so the I/O work itself is unchanged."""
        m, costs, env, dtype = self.ctx.machine, self.ctx.costs, self.ctx.machine.env, self.ctx.dtype
        rows = list(zip(*(a.tolist() for a in clusters), strict=True))
        reads = [self._cluster_reads(gate_miss, ud_miss) for _, _, gate_miss, ud_miss in rows]
        first_mats = 1  # the gate decides which neurons fired (as in _cluster)
        gate_jobs = [m.cpu_job("gate", *_wo(costs.neurons(n, first_mats)), dtype) for n, *_ in rows]
        if n_npu:
            gate_jobs.insert(0, m.accel_job(self.hot_unit, "ffn-hot", *_wo(costs.neurons(n_npu)), dtype))
        ud_mats = self.ctx.model.ffn_matrices - first_mats
        for stage in (
                [m.read("gate-read", g, self.gate_block, span_bytes=self.span_bytes) for g, _ in reads if g],
                gate_jobs,
                [m.read("updown-read", u, self.ud_block, span_bytes=self.span_bytes) for _, u in reads if u],
                [m.cpu_job("up-down", *_wo(costs.neurons(f, ud_mats)), dtype) for _, f, *_ in rows if f]):
            if stage:
                yield env.all_of([env.process(job) for job in stage])
        stats.flash_bytes += sum(g * self.gate_block + u * self.ud_block for g, u in reads)

    def _cluster(self, n: int, n_fired: int, gate_miss: int, ud_miss: int, stats: TokenStats) -> Event:
        m, costs, dtype = self.ctx.machine, self.ctx.costs, self.ctx.dtype
        gate_reads, ud_reads = self._cluster_reads(gate_miss, ud_miss)
        first_mats = 1  # the gate (the up matrix in non-gated FFNs) decides which neurons fired
        if gate_reads:
            yield from m.read("gate-read", gate_reads, self.gate_block, span_bytes=self.span_bytes)
            stats.flash_bytes += gate_reads * self.gate_block
        w = costs.neurons(n, first_mats)
        yield from m.cpu_job("gate", w.weight_bytes, w.ops, dtype)
        if ud_reads:
            yield from m.read("updown-read", ud_reads, self.ud_block, span_bytes=self.span_bytes)
            stats.flash_bytes += ud_reads * self.ud_block
        if n_fired:
            w = costs.neurons(n_fired, self.ctx.model.ffn_matrices - first_mats)
            yield from m.cpu_job("up-down", w.weight_bytes, w.ops, dtype)

    # -- prefill -----------------------------------------------------------------------------
    def prefill(self, stats: TokenStats) -> Event:
        ctx, m = self.ctx, self.ctx.machine
        env, costs, model = m.env, ctx.costs, ctx.model
        p = ctx.prompt_tokens
        npu = self.k.prefill_on_npu and self.k.xpu and ctx.device.npu is not None
        unit = self.k.prefill_unit or ("npu" if npu else "cpu")
        offload = ctx.plan.offload_fraction
        layer_ffn_flash = model.n_experts * model.ffn_dim * self.bundle.flash_bytes
        read_bytes = int(offload * layer_ffn_flash)
        block = self.k.prefill_block_bytes
        ready = [env.event() for _ in range(model.n_layers)]

        def prefetch() -> Event:  # one big core streams each layer's missing weights in order
            for layer in range(model.n_layers):
                if read_bytes:
                    yield from m.read("prefetch", -(-read_bytes // block), block, sequential=True)
                    stats.flash_bytes += -(-read_bytes // block) * block
                ready[layer].succeed()

        env.process(prefetch())
        attn = costs.attention(p, batch=p)
        layer = Work(costs.layer_weight_bytes(), attn.ops + costs.dense_ffn().ops * p)
        convert, on_unit, unit_dtype = costs.on_unit(accelerator(ctx.device, unit), layer, costs.layer_weights())
        start = ready  # what layer i's compute waits for
        if convert is not None:  # [PI2 §4.1]: the CPU converts each layer once it is in DRAM,
            converted = [env.event() for _ in range(model.n_layers)]  # while the unit runs the last

            def convert_layers() -> Event:
                # In tiles: a job's DRAM share is fixed when it starts, so a layer converted in
                # one job would keep the share it started with beside the NPU after the NPU is done.
                tile = convert.scaled(1 / CONVERT_TILES)
                for i in range(model.n_layers):
                    yield ready[i]
                    for _ in range(CONVERT_TILES):
                        yield from m.cpu_parallel("dequantize", *_wo(tile), ctx.dtype, kernel="dequant")
                    converted[i].succeed()

            env.process(convert_layers())
            start = converted
        for i in range(model.n_layers):
            yield start[i]
            if unit != "cpu":
                yield from m.accel_job(unit, "prefill", *_wo(on_unit), unit_dtype, batch=p)
            else:
                yield from m.cpu_parallel("prefill", *_wo(layer), ctx.dtype, kernel="gemm")
        yield from m.cpu_parallel("lm_head", *_wo(costs.lm_head()), ctx.dtype)

    # -- analytic --------------------------------------------------------------------------
    # [PI2 §5.3] cost model: attention + predictor + max(FFN compute, I/O) per layer, in two
    # parts: what the trace and the cache decide (a plan per token), then its cost on this
    # device for many tokens at once, which sim.engine.reevaluate redoes alone after a device
    # or profile edit.
    def analytic_plan(self, layers: list[LayerWork], stats: TokenStats) -> TokenPlan:
        """A decode token's routing, cache hits and clusters (its requests, hits and misses go
        to ``stats``). The cache sees token 0, as the per-layer form always gave it."""
        return self._token_plan(layers, 0, stats)

    def analytic_costs_s(self, plans: Sequence[TokenPlan], contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per token (``contexts[i]`` tokens in the KV cache) its closed-form time and flash bytes.

        Each term is affine in its work at a fixed arithmetic intensity (a roofline plus a
        request latency or launch), so its coefficients come from the device models once
        (:func:`sim.engine.costs.affine_in_count`) and the terms of every (token, layer) are
        array operations; sums differ from one call per layer only in float rounding.
        """
        ctx, costs, m = self.ctx, self.ctx.costs, self.ctx.machine
        dtype, mats = ctx.dtype, ctx.model.ffn_matrices
        cpu = frozenset({"cpu"})
        both = cpu | {self.hot_unit}

        def parallel(w: Work, dt: str, agents: frozenset[str] = cpu, kernel: str = "dense_gemv") -> float:
            return m.parallel_time_s(w.weight_bytes, w.ops, dt, agents, kernel=kernel)

        attn = np.array([parallel(costs.attention(int(c)) + costs.router(), dtype) for c in contexts])
        pred = parallel(costs.predictor(), ctx.model.predictor.dtype)
        head = parallel(costs.lm_head(), dtype)
        n_layers = len(plans[0].n_npu) if plans else 0
        n_npu = np.array([n for p in plans for n in p.n_npu], dtype=float)
        shift = np.cumsum([0] + [p.bounds[-1] for p in plans[:-1]])
        bounds = np.concatenate([[0]] + [p.bounds[1:] + s for p, s in zip(plans, shift, strict=True)])
        neurons, fired, gate_miss, ud_miss = (np.concatenate([p.arrays[i] for p in plans]) if plans else
                                              np.zeros(0, np.int64) for i in range(4))
        gate, ud = self._cluster_reads(gate_miss, ud_miss)

        def per_layer(x: np.ndarray) -> np.ndarray:
            total = np.concatenate([[0], np.cumsum(x)])
            return total[bounds[1:]] - total[bounds[:-1]]

        # CPU: the sparse kernel's time per operation (with and without the NPU beside it on DRAM)
        work = costs.neurons(per_layer(neurons), 1) + costs.neurons(per_layer(fired), mats - 1)
        ref = costs.neurons(2.0**20, 1)
        per_op = {agents: parallel(ref, dtype, agents, "sparse_gemv") / ref.ops
                  for agents in (cpu, both) if agents == cpu or np.any(n_npu > 0)}
        cpu_ffn = work.ops * np.where(n_npu > 0, per_op.get(both, 0.0), per_op[cpu])
        npu_ffn = np.zeros_like(n_npu)
        if np.any(n_npu > 0):
            acc, bw = accelerator(ctx.device, self.hot_unit), m.dram.agent_gbps(self.hot_unit, both)
            a, b = affine_in_count(lambda n: accel_kernel_time_s(acc, *_wo(costs.neurons(n)), bw, dtype))
            npu_ffn = np.where(n_npu > 0, a + b * n_npu, 0.0)
        io = np.zeros_like(n_npu)
        io_core = m.io_threads[0].core
        # The single I/O thread serves a layer's batches one after another; only the first
        # starts on an idle device and pays the latency, the rest are queued behind it and run
        # back-to-back (as the DES charges them, Machine.read): transfers per request, one
        # latency per layer that reads at all.
        for reads, block in ((gate, self.gate_block), (ud, self.ud_block)):
            if np.any(reads > 0):
                _, b = affine_in_count(lambda n, block=block: m.flash.batch_time_s(
                    n, block, io_core, span_bytes=self.span_bytes, back_to_back=True))
                io += b * per_layer(reads)
        io += m.flash.latency_s * (per_layer((gate > 0) | (ud > 0)) > 0)
        compute = np.maximum(cpu_ffn, npu_ffn)
        # with the pipeline reads hide behind compute; without it they add to it
        layer_s = (np.maximum(compute, io) if self.k.pipeline else compute + io) + pred
        token_s = np.add.reduceat(layer_s, np.arange(0, layer_s.size, max(n_layers, 1))) if layer_s.size else \
            np.zeros(len(plans))
        latency = token_s + attn * n_layers + head
        flash = per_layer(gate * self.gate_block + ud * self.ud_block)
        flash_per_token = flash.reshape(len(plans), n_layers).sum(axis=1) if plans else np.zeros(0)
        return latency, flash_per_token

    def analytic_token_s(self, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> float:
        latency, flash = self.analytic_costs_s([self.analytic_plan(layers, stats)], np.array([context_tokens]))
        stats.flash_bytes += int(flash[0])
        return float(latency[0])

    # -- what `sim plan` searches ([PI2 §5.3]'s planner: threads, cluster size, hot/cold split) ----
    plan_knobs = ("compute_cores", "io_cores", "cluster_neurons", "npu_activation_share", "hot_share", "policy",
                  "hot_unit")

    @classmethod
    def plan_space(cls, device: DeviceProfile) -> list[Family]:
        accelerated = device.npu is not None or device.gpu is not None
        return [
            ("cores", core_layouts(device)),
            ("hot_share", [{"hot_share": v} for v in (0.25, 0.5, 0.75, 1.0)]),
            ("policy", [{"policy": v} for v in plan_policies(cls.keeps_profile)]),
            # [PI2 §4.2] uses 512 neurons; smaller clusters lose on overhead
            ("cluster_neurons", [{"cluster_neurons": v} for v in (256, 512, 1024, 2048)]),
            ("npu_activation_share",
             [{"npu_activation_share": v} for v in ((0.0, 0.25, 0.5, 0.75) if accelerated else (0.0,))]),
            # the accelerator for that share: the NPU (None, the default) or the GPU, which on a
            # phone without an NPU is the only one (the default then leaves the share on the CPU)
            ("hot_unit", [{"hot_unit": v} for v in ([None, "gpu"] if device.gpu else [None])]),
        ]

    @classmethod
    def spelled_out(cls, knobs: dict[str, Any], device: DeviceProfile) -> dict[str, Any]:
        if knobs.get("hot_unit") is None and device.npu is not None:
            return {**knobs, "hot_unit": "npu"}  # what the default means on this phone
        return knobs


def _wo(w: Work) -> tuple[float, float]:
    return w.weight_bytes, w.ops
