"""The simulated phone: long-lived simpy resources for CPU threads, the I/O thread, NPU/GPU.

Only a few resources exist (one store of CPU compute threads, one I/O thread per issuing
core, one NPU, one GPU). Work arrives as whole neuron clusters, flash batches or layer
phases, and each job's duration is computed when it starts from the device profile and
the DRAM sharing at that moment, so the number of simpy events per token stays small.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from sim.engine.unit_labels import accelerator, compute_label, io_label
from sim.hw.dram import DramModel
from sim.hw.flash import FlashModel
from sim.hw.processors import accel_kernel_time_s, cpu_demand_gbps, cpu_kernel_time_s, cpu_parallel_time_s
from sim.profiles.device import CpuCluster, DeviceProfile

Event = Generator[Any, Any, Any]
_CPU_ONLY = frozenset({"cpu"})


@dataclass
class Thread:
    name: str
    core: CpuCluster


class ThreadPool(simpy.Store):
    """Idle compute threads, handed out fastest core first.

    An idle big core picks up the next neuron cluster before a slower one (as an
    energy-aware scheduler places a busy thread on the biggest free core). Handing
    threads out in the order they became free instead would give work to a slow core
    while a fast one idles, and adding a core could then slow a layer down.
    """

    def __init__(self, env: simpy.Environment, threads: list[Thread]):
        super().__init__(env, capacity=max(1, len(threads)))
        order = sorted(range(len(threads)), key=lambda i: (-threads[i].core.int8_gops,
                                                           -threads[i].core.fp32_gflops, i))
        self._rank = {threads[i].name: r for r, i in enumerate(order)}
        self.items = [threads[i] for i in order]

    def _key(self, thread: Thread) -> int:
        return self._rank[thread.name]

    def insert(self, thread: Thread) -> None:
        bisect.insort(self.items, thread, key=self._key)

    def _do_put(self, event: Any) -> None:
        if len(self.items) < self._capacity:
            self.insert(event.item)
            event.succeed()


def _put_now(store: simpy.Store, item: Any) -> None:
    """Put ``item`` straight into ``store`` (the caller checked nobody waits): a thread pool
    keeps its fastest-first order, a plain store its arrival order."""
    if isinstance(store, ThreadPool):
        store.insert(item)
    else:
        store.items.append(item)


@dataclass
class Span:
    unit: str
    name: str
    start_s: float
    end_s: float
    token: int


@dataclass
class Usage:
    """Busy seconds per unit and flash traffic, accumulated over a run."""

    busy_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    flash_bytes: int = 0
    flash_requests: int = 0
    dram_bytes: float = 0.0


class Machine:
    """Simpy view of a device running one inference process.

    ``fast_paths``: when nothing else is due at the current instant, taking a free thread
    or queue slot (or handing one back nobody waits for) cannot reorder any event, so it
    is done directly instead of through a simpy event the process would yield on. This
    removes most events of a token without changing any result (a test runs both ways).
    """

    fast_paths: bool = True
    # Strategies may schedule a closed phase (one whose resources nothing else touches) in
    # one compiled call and advance the clock by its length; False forces their per-job
    # simpy processes, which the tests use as the reference.
    compiled_phases: bool = True

    def __init__(self, env: simpy.Environment, device: DeviceProfile, compute_cores: list[str],
                 io_cores: list[str], *, record_spans: bool = False):
        self.env = env
        self.device = device
        self.dram = DramModel(device)
        self.flash = FlashModel(device)
        self.usage = Usage()
        self.record_spans = record_spans
        self.spans: list[Span] = []
        self.token = -1
        self.threads = self._threads(compute_cores)
        self.free_threads = ThreadPool(env, self.threads)
        self.threads_by_speed = list(self.free_threads.items)  # the order the pool hands them out
        self.io_threads = [Thread(io_label(i, name), device.cpu.cluster(name)) for i, name in enumerate(io_cores)]
        self.io_free = simpy.Store(env, capacity=max(1, len(self.io_threads)))
        for th in self.io_threads:
            self.io_free.put(th)
        # UFS has `command_queues` hardware queues; batches from several issuers share them.
        self.storage = simpy.Resource(env, capacity=device.storage.command_queues)
        # With several command queues, batches overlap their latency but the device still
        # moves one batch's data at a time (see read()).
        self.flash_transfer = simpy.Resource(env, capacity=1)
        self.npu = simpy.Resource(env, capacity=1) if device.npu else None
        self.gpu = simpy.Resource(env, capacity=1) if device.gpu else None
        self.active_agents: dict[str, int] = defaultdict(int)
        self.cpu_demand_gbps: dict[str, float] = {}  # running CPU thread -> bandwidth it would use
        self.active_issuers = 0
        self._phase_memo: dict[tuple, float] = {}  # barrier phases' durations (see cpu_parallel)
        self._shares_memo: dict[tuple, list[tuple[str, int, int]]] = {}  # see _issuer_shares

    # -- booking: strategies that schedule a phase themselves (one compiled call) book its
    # busy time and traffic here, never in ``usage`` directly, so the machine stays the one
    # place that accounts for what its units did.
    def book_busy(self, unit: str, seconds: float) -> None:
        """Charge ``seconds`` of busy time to ``unit`` (a thread, ``storage``, ``npu``, ``gpu``)."""
        self.usage.busy_s[unit] += seconds

    def book_dram(self, nbytes: float) -> None:
        """Count ``nbytes`` of DRAM traffic."""
        self.usage.dram_bytes += nbytes

    def book_flash(self, nbytes: int, requests: int) -> None:
        """Count ``requests`` flash reads of ``nbytes`` in all."""
        self.usage.flash_bytes += nbytes
        self.usage.flash_requests += requests

    def busy_table(self, units: list[str]) -> np.ndarray:
        """Busy seconds so far of ``units``, for a compiled kernel to add to in place."""
        return np.array([self.usage.busy_s[unit] for unit in units], dtype=float)

    def store_busy(self, units: list[str], seconds: np.ndarray) -> None:
        """Write back a :meth:`busy_table` the kernel added to."""
        for unit, value in zip(units, seconds.tolist(), strict=True):
            self.usage.busy_s[unit] = value

    def _threads(self, names: list[str]) -> list[Thread]:
        counts: dict[str, int] = defaultdict(int)
        threads = []
        for name in names:
            core = self.device.cpu.cluster(name)
            threads.append(Thread(compute_label(name, counts[name]), core))
            counts[name] += 1
        return threads

    # -- fast paths (see the class docstring) -----------------------------------------
    def _quiet(self) -> bool:
        """No other event is due now: acting without a yield cannot reorder anything."""
        return self.fast_paths and self.env.peek() > self.env.now

    def _take(self, store: simpy.Store) -> Any:
        """A free item, taken at once, or None when the caller must ``yield store.get()``."""
        if store.items and not store.get_queue and self._quiet():
            return store.items.pop(0)
        return None

    def _give(self, store: simpy.Store, item: Any) -> bool:
        """Put ``item`` back at once; False when the caller must ``yield store.put(item)``."""
        if not store.get_queue and not store.put_queue and len(store.items) < store.capacity and self._quiet():
            _put_now(store, item)
            return True
        return False

    def _take_many(self, store: simpy.Store, n: int) -> Event:
        """``n`` items of ``store`` in its hand-out order (fastest threads first): taken at once
        when all are free and nothing else is due, else one by one as they come free."""
        if len(store.items) >= n and not store.get_queue and self._quiet():
            taken = store.items[:n]
            del store.items[:n]
            return taken
        taken = []
        for _ in range(n):
            item = self._take(store)
            taken.append(item if item is not None else (yield store.get()))
        return taken

    def _give_many(self, store: simpy.Store, items: list[Any]) -> Event:
        """Hand ``items`` back to ``store``: at once when nobody waits and nothing else is
        due, else one by one (waiters first come, first served)."""
        if (not store.get_queue and not store.put_queue and len(store.items) + len(items) <= store.capacity
                and self._quiet()):
            for item in items:
                _put_now(store, item)
            return
        for item in items:
            if not self._give(store, item):
                yield store.put(item)

    def _acquire(self, res: simpy.Resource) -> Any:
        """A granted request on ``res`` without yielding, or None (then request and yield)."""
        if len(res.users) < res.capacity and not res.put_queue and self._quiet():
            req = res.request()  # granted in its constructor; its event is a no-op
            return req
        return None

    def _release(self, res: simpy.Resource, req: Any) -> None:
        """Release ``req``; with nobody queued the Release event would be a no-op."""
        if self.fast_paths and not res.put_queue and req in res.users:
            res.users.remove(req)
        else:
            res.release(req)

    def delay_until(self, t: float) -> float:
        """The timeout delay that lands the clock exactly on ``t`` (``now + (t - now)`` can
        miss it by a rounding step, and a compiled phase must end where its last event
        would have)."""
        now = self.env.now
        delay = max(0.0, t - now)
        while now + delay < t:
            delay = math.nextafter(delay, math.inf)
        while delay > 0 and now + delay > t:
            delay = math.nextafter(delay, -math.inf)
        return delay

    # -- bookkeeping -----------------------------------------------------------------
    def _span(self, unit: str, name: str, start: float) -> None:
        end = self.env.now
        self.usage.busy_s[unit] += end - start
        if self.record_spans:
            self.spans.append(Span(unit, name, start, end, self.token))

    def _agents(self) -> frozenset[str]:
        return frozenset(a for a, n in self.active_agents.items() if n > 0)

    def thread_gbps(self, thread: Thread, active_threads: int) -> float:
        return self.dram.cpu_thread_gbps(thread.core.mem_gbps, active_threads, self._agents() | {"cpu"})

    def _cpu_shares(self, threads: list[Thread], weight_bytes: float, ops: float, dtype: str,
                    agents: frozenset[str], kernel: str) -> list[float]:
        """Bandwidth for ``threads`` starting this kernel next to the CPU jobs already running."""
        demands = [cpu_demand_gbps(th.core, weight_bytes, ops, dtype, kernel) for th in threads]
        running = list(self.cpu_demand_gbps.values())  # idle threads are never in it
        shares = self.dram.cpu_thread_shares(running + demands, agents)
        for th, d in zip(threads, demands, strict=True):
            self.cpu_demand_gbps[th.name] = d
        return shares[len(running):]

    def parallel_time_s(self, weight_bytes: float, ops: float, dtype: str,
                        agents: frozenset[str] = frozenset({"cpu"}), threads: int | None = None,
                        kernel: str = "dense_gemv", overhead_s: float = 0.0) -> float:
        """Closed-form time of a phase on the first ``threads`` compute threads (default all),
        shared exactly as :meth:`cpu_parallel` shares it (for the analytic mode), plus its
        fixed ``overhead_s``."""
        use = self.threads_by_speed[: threads or len(self.threads)]  # those cpu_parallel would grab
        demands = [cpu_demand_gbps(th.core, weight_bytes, ops, dtype, kernel) for th in use]
        bws = self.dram.cpu_thread_shares(demands, agents)
        return cpu_parallel_time_s([th.core for th in use], weight_bytes, ops, bws, dtype, kernel) + overhead_s

    # -- CPU ---------------------------------------------------------------------------
    def cpu_job(self, name: str, weight_bytes: float, ops: float, dtype: str, kernel: str = "sparse_gemv") -> Event:
        """Run one kernel on the next free compute thread (a neuron cluster, by default)."""
        thread = self._take(self.free_threads)
        if thread is None:
            thread = yield self.free_threads.get()
        self.active_agents["cpu"] += 1
        [bw] = self._cpu_shares([thread], weight_bytes, ops, dtype, self._agents(), kernel)
        duration = cpu_kernel_time_s(thread.core, weight_bytes, ops, bw, dtype, kernel)
        start = self.env.now
        self.usage.dram_bytes += weight_bytes
        yield self.env.timeout(duration)
        self.active_agents["cpu"] -= 1
        del self.cpu_demand_gbps[thread.name]
        self._span(thread.name, name, start)
        if not self._give(self.free_threads, thread):
            yield self.free_threads.put(thread)

    def cpu_parallel(self, name: str, weight_bytes: float, ops: float, dtype: str, threads: int | None = None,
                     kernel: str = "dense_gemv", overhead_s: float = 0.0) -> Event:
        """A barrier phase shared by all compute threads (attention, predictor, LM head).

        All threads are idle at a phase boundary, so the phase is one event; each thread's
        busy time is still accounted separately. ``overhead_s`` is a fixed time the phase
        takes beyond its bytes and ops (a framework's per-call dispatch), its threads held.
        """
        pool = self.free_threads
        grabbed = yield from self._take_many(pool, threads or len(self.threads))
        self.active_agents["cpu"] += 1
        duration = self._barrier_duration(grabbed, weight_bytes, ops, dtype, kernel, self._agents()) + overhead_s
        start = self.env.now
        self.usage.dram_bytes += weight_bytes
        yield self.env.timeout(duration)
        self.active_agents["cpu"] -= 1
        for th in grabbed:
            del self.cpu_demand_gbps[th.name]
        for th in grabbed:
            self.usage.busy_s[th.name] += duration
            if self.record_spans:
                self.spans.append(Span(th.name, name, start, start + duration, self.token))
        yield from self._give_many(pool, grabbed)

    def _barrier_duration(self, grabbed: list[Thread], weight_bytes: float, ops: float, dtype: str, kernel: str,
                          agents: frozenset[str], register: bool = True) -> float:
        """A barrier phase's length on ``grabbed``; registers their DRAM demand (the caller
        removes it) unless ``register`` is False (a closed stretch, where nobody reads it)."""
        # Threads take work in small chunks (as llama.cpp and PowerInfer do), so each gets a
        # share proportional to its speed and all finish together.
        # With nothing else on the CPU the phase's time depends on its own inputs only: remembered.
        key = None if self.cpu_demand_gbps else (weight_bytes, ops, dtype, kernel, agents,
                                                 tuple(th.name for th in grabbed))
        duration = self._phase_memo.get(key) if key else None
        if duration is None:
            shares = self._cpu_shares(grabbed, weight_bytes, ops, dtype, agents, kernel)
            duration = cpu_parallel_time_s([th.core for th in grabbed], weight_bytes, ops, shares, dtype, kernel)
            if key and len(self._phase_memo) < 4096:
                self._phase_memo[key] = duration
        elif register:
            for th in grabbed:
                self.cpu_demand_gbps[th.name] = cpu_demand_gbps(th.core, weight_bytes, ops, dtype, kernel)
        return duration

    # -- closed stretches (see closed()) --------------------------------------------------
    def closed(self) -> bool:
        """Whether the caller may run a stretch of sequential phases without yielding.

        True when nothing else exists in the simulation (no event is due, every thread,
        I/O thread and queue is free), no timeline is recorded and compiled phases are
        allowed. Then a strategy whose phases follow one another (each a barrier) can add
        their lengths to a local clock, exactly as the clock would advance, and yield once
        at the end: the same times, busy seconds and traffic, without an event per phase.
        """
        return (self.fast_paths and self.compiled_phases and not self.record_spans
                and self.env.peek() == math.inf and len(self.free_threads.items) == len(self.threads)
                and len(self.io_free.items) == len(self.io_threads) and not self.storage.users
                and not self.cpu_demand_gbps and not any(self.active_agents.values()))

    def barrier_s(self, weight_bytes: float, ops: float, dtype: str, threads: int | None = None,
                  kernel: str = "dense_gemv") -> float:
        """The length :meth:`cpu_parallel` would give a phase started in a closed stretch (on
        the threads the pool would hand out, the CPU alone on DRAM); the caller books the
        busy time and traffic."""
        grabbed = self.threads_by_speed[: threads or len(self.threads)]
        duration = self._barrier_duration(grabbed, weight_bytes, ops, dtype, kernel, _CPU_ONLY, register=False)
        self.cpu_demand_gbps.clear()  # set on a first computation
        return duration

    def closed_cpu(self, weight_bytes: float, ops: float, dtype: str, threads: int | None = None,
                   kernel: str = "dense_gemv", overhead_s: float = 0.0) -> float:
        """:meth:`cpu_parallel` inside a closed stretch: its length, with the same busy time
        and traffic booked."""
        duration = self.barrier_s(weight_bytes, ops, dtype, threads, kernel) + overhead_s
        self.usage.dram_bytes += weight_bytes
        busy = self.usage.busy_s
        for th in self.threads_by_speed[: threads or len(self.threads)]:
            busy[th.name] += duration
        return duration

    def closed_read(self, start: float, n_requests: int, block_bytes: int, *, sequential: bool = False,
                    span_bytes: int | None = None, issuers: int = 1, blocking: bool = False) -> float:
        """:meth:`read` of a batch split over several I/O threads (``issuers > 1`` or
        ``blocking``), started at ``start`` inside a closed stretch: its length, with the
        same traffic and busy time booked."""
        assert issuers > 1 or blocking, "a closed read stands for the parallel path of read()"
        if n_requests <= 0:
            return 0.0
        n_threads = max(1, min(issuers, len(self.io_threads)))
        grabbed = self.io_free.items[:n_threads]  # what _take_many would hand out
        cores = [th.core for th in grabbed]
        duration = self.flash.parallel_batch_time_s(n_requests, block_bytes, cores, sequential=sequential,
                                                    span_bytes=span_bytes, blocking=blocking, other_issuers=0)
        self.usage.flash_bytes += n_requests * block_bytes
        self.usage.flash_requests += n_requests
        self.usage.busy_s["storage"] += (start + duration) - start  # as _span books it: end minus start
        self._charge_issuers(grabbed, duration)
        return duration

    # -- storage ---------------------------------------------------------------------------
    def read(self, name: str, n_requests: int, block_bytes: int, *, sequential: bool = False,
             span_bytes: int | None = None, issuers: int = 1, blocking: bool = False) -> Event:
        """Issue a batch of reads from an I/O thread and wait until all complete.

        On a single-queue device a batch queued behind another (it waited for the I/O thread
        or the storage) runs back-to-back and costs only its transfer; one that finds the
        device idle pays the read latency too (:meth:`FlashModel.batch_time_s`).

        ``issuers > 1`` splits the batch over that many I/O threads issuing at once (LLM in
        a Flash's 32 reader threads, llama.cpp's faulting compute threads); ``blocking``
        threads keep one request in flight each (see
        :meth:`~sim.hw.flash.FlashModel.parallel_throughput_gbps`).
        """
        if n_requests <= 0:
            return
        if issuers > 1 or blocking:
            yield from self._parallel_read(name, n_requests, block_bytes, sequential, span_bytes, issuers, blocking)
            return
        asked = self.env.now
        thread = self._take(self.io_free)
        if thread is None:
            thread = yield self.io_free.get()
        slot = self._acquire(self.storage)
        if slot is None:
            slot = self.storage.request()
            yield slot
        self.active_issuers += 1
        # On a single queue, a batch that had to wait for the I/O thread or the storage slot
        # starts the instant the batch before it ends; its commands were queued meanwhile, so
        # the device never idles and its latency hides behind that transfer. A batch that
        # finds both free starts on an idle device and pays the latency (as the compiled
        # FFN phase charges it, sim.engine.cluster_schedule).
        back_to_back = self.storage.capacity == 1 and self.env.now > asked
        duration = self.flash.batch_time_s(n_requests, block_bytes, thread.core, sequential=sequential,
                                           span_bytes=span_bytes, n_issuers=self.active_issuers,
                                           back_to_back=back_to_back)
        start = self.env.now
        if self.storage.capacity > 1:
            # The throughput curve is the device's at full queue: batches on other queues
            # hide their latency behind this one but cannot add to its transfer rate.
            yield self.env.timeout(self.flash.latency_s)
            with self.flash_transfer.request() as transfer:
                yield transfer
                yield self.env.timeout(duration - self.flash.latency_s)
            duration = self.env.now - start
        else:
            yield self.env.timeout(duration)
        self.active_issuers -= 1
        self._release(self.storage, slot)
        self.usage.flash_bytes += n_requests * block_bytes
        self.usage.flash_requests += n_requests
        self._span("storage", name, start)
        self.usage.busy_s[thread.name] += duration
        if self.record_spans:  # the issuing core's track (it runs the UFS driver meanwhile)
            self.spans.append(Span(thread.name, name, start, start + duration, self.token))
        if not self._give(self.io_free, thread):
            yield self.io_free.put(thread)

    def _parallel_read(self, name: str, n_requests: int, block_bytes: int, sequential: bool,
                       span_bytes: int | None, issuers: int, blocking: bool) -> Event:
        """One batch split over several I/O threads: a single storage event (a barrier).

        The issuing cores' busy time is charged once per core (:meth:`_charge_issuers`), so
        32 threads on 8 cores do not count as 32 busy cores.
        """
        n_threads = max(1, min(issuers, len(self.io_threads)))
        store = self.io_free
        grabbed = yield from self._take_many(store, n_threads)
        cores = [th.core for th in grabbed]
        n_cores = self.flash.issuing_cores(cores)
        slot = self._acquire(self.storage)
        if slot is None:
            slot = self.storage.request()
            yield slot
        other = self.active_issuers
        self.active_issuers += n_cores
        duration = self.flash.parallel_batch_time_s(n_requests, block_bytes, cores, sequential=sequential,
                                                    span_bytes=span_bytes, blocking=blocking, other_issuers=other)
        start = self.env.now
        yield self.env.timeout(duration)
        self.active_issuers -= n_cores
        self._release(self.storage, slot)
        self.usage.flash_bytes += n_requests * block_bytes
        self.usage.flash_requests += n_requests
        self._span("storage", name, start)
        self._charge_issuers(grabbed, duration)
        yield from self._give_many(store, grabbed)

    def _charge_issuers(self, threads: list[Thread], duration: float) -> None:
        """Each core the threads occupy is busy for ``duration`` once, shared by the threads on
        its cluster: 6 of 32 readers on a one-core cluster charge that core 100%, not 6/32 of
        all the cores the readers use."""
        busy = self.usage.busy_s
        for name, cores, n in self._issuer_shares(threads):
            busy[name] += duration * cores / n

    def _issuer_shares(self, threads: list[Thread]) -> list[tuple[str, int, int]]:
        """Per thread of a batch its share of the busy time (remembered per set of threads: a
        reader pool hands out the same few sets, and a port's 32 readers charge every batch)."""
        key = tuple(th.name for th in threads)
        shares = self._shares_memo.get(key)
        if shares is None:
            per_cluster: dict[str, int] = defaultdict(int)
            for th in threads:
                per_cluster[th.core.name] += 1
            shares = [(th.name, min(per_cluster[th.core.name], th.core.cores), per_cluster[th.core.name])
                      for th in threads]
            if len(self._shares_memo) < 4096:  # a pool hands out few sets; bounded like _phase_memo
                self._shares_memo[key] = shares
        return shares

    # -- accelerators ------------------------------------------------------------------------
    def accel_time_s(self, unit: str, weight_bytes: float, ops: float, dtype: str, agents: frozenset[str],
                     batch: int = 1, launches: int = 1) -> float:
        """An NPU/GPU call's time with ``agents`` (including ``unit``) streaming from DRAM."""
        prof = accelerator(self.device, unit)
        assert prof is not None
        bw = self.dram.agent_gbps(unit, agents)
        return accel_kernel_time_s(prof, weight_bytes, ops, bw, dtype, batch, launches)

    def closed_accel(self, now: float, unit: str, weight_bytes: float, ops: float, dtype: str,
                     batch: int = 1) -> float:
        """:meth:`accel_job` inside a closed stretch started at ``now`` (the unit streams
        alone): the time it ends, with the same busy time and traffic booked."""
        end = now + self.accel_time_s(unit, weight_bytes, ops, dtype, frozenset({unit}), batch)
        self.usage.dram_bytes += weight_bytes
        self.usage.busy_s[unit] += end - now  # as accel_job's span books it
        return end

    def accel_job(self, unit: str, name: str, weight_bytes: float, ops: float, dtype: str, batch: int = 1,
                  launches: int = 1) -> Event:
        res = self.npu if unit == "npu" else self.gpu
        assert res is not None
        req = self._acquire(res)
        if req is None:
            req = res.request()
            yield req
        self.active_agents[unit] += 1
        duration = self.accel_time_s(unit, weight_bytes, ops, dtype, self._agents(), batch, launches)
        start = self.env.now
        self.usage.dram_bytes += weight_bytes
        yield self.env.timeout(duration)
        self.active_agents[unit] -= 1
        self._span(unit, name, start)
        self._release(res, req)
