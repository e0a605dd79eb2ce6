"""Strictly sequential layer execution: each step waits for the one before it.

LLM in a Flash loads a layer's neurons and only then computes it [FLASH §3], and
llama.cpp's page faults stall the faulting threads [mmap]; neither overlaps I/O with
compute. Such a token is a list of steps (a CPU phase on the compute threads, a call on
the GPU or NPU, or a batch of flash reads from several issuing threads), so the
discrete-event run and the analytic closed form charge exactly the same work: the DES
replays the steps through :class:`~sim.engine.machine.Machine`, the analytic mode adds up
their service times. With nothing running concurrently the two agree exactly, which a
test holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.costs import ModelCosts, Work
from sim.engine.machine import Machine
from sim.engine.strategies.base import Event, TokenStats
from sim.engine.unit_labels import accelerator
from sim.profiles.device import DeviceProfile


@dataclass(frozen=True)
class Step:
    """One CPU phase (``kind="cpu"``), one accelerator call (``kind="accel"`` on ``unit``, a
    batch of ``batch`` rows) or one batch of flash reads (``kind="read"``).

    ``overhead_s`` (CPU steps only) is the time the step takes beyond its bytes and ops: a
    framework's fixed per-call cost (eager PyTorch's op dispatch, say) summed over the calls
    the step stands for. It is paid serially, the step's threads held (and counted busy)
    meanwhile, so it adds exactly ``overhead_s`` to the step's length in both the
    discrete-event replay and the analytic sum.
    """

    phase: str  # per-token column it is charged to, e.g. "io_s"
    kind: str
    name: str
    weight_bytes: float = 0.0
    ops: float = 0.0
    dtype: str = "fp16"
    threads: int | None = None  # CPU threads used (None: all compute threads)
    kernel: str = "dense_gemv"  # CPU kernel class (sim.hw.processors.KERNELS)
    n_requests: int = 0
    block_bytes: int = 0
    sequential: bool = False
    span_bytes: int | None = None
    unit: str = "cpu"  # "npu" or "gpu" for an accelerator call
    batch: int = 1
    overhead_s: float = 0.0  # fixed time beyond bytes and ops (a CPU step's per-call dispatch, serial)

    def __post_init__(self) -> None:
        if self.overhead_s and self.kind != "cpu":
            raise ValueError(f"only a CPU step carries an overhead, not a {self.kind!r} step")

    @property
    def empty(self) -> bool:
        if self.kind == "read":
            return self.n_requests <= 0
        return self.weight_bytes <= 0 and self.ops <= 0 and self.overhead_s <= 0


def cpu(phase: str, name: str, weight_bytes: float, ops: float, dtype: str, threads: int | None = None,
        kernel: str = "dense_gemv", overhead_s: float = 0.0) -> Step:
    return Step(phase, "cpu", name, weight_bytes=weight_bytes, ops=ops, dtype=dtype, threads=threads, kernel=kernel,
                overhead_s=overhead_s)


def compute(unit: str, phase: str, name: str, weight_bytes: float, ops: float, dtype: str, *, batch: int = 1,
            threads: int | None = None, kernel: str = "dense_gemv") -> Step:
    """A compute step on ``unit``: the CPU's compute threads (``threads``, ``kernel``) or one
    call on the NPU or GPU at ``batch`` rows per product (its profile's efficiency curve)."""
    if unit == "cpu":
        return cpu(phase, name, weight_bytes, ops, dtype, threads=threads, kernel=kernel)
    return Step(phase, "accel", name, weight_bytes=weight_bytes, ops=ops, dtype=dtype, unit=unit, batch=batch)


def on_unit(costs: ModelCosts, device: DeviceProfile, unit: str, phase: str, name: str, work: Work,
            n_weights: float, *, batch: int = 1, kernel: str = "dense_gemv") -> list[Step]:
    """``work`` (a product over ``n_weights`` weights of the run's format) on ``unit``: one
    compute step, after a CPU step converting the weights when the unit cannot compute on
    that format (its profile's ``formats``; charged to ``dequantize_s``)."""
    convert, unit_work, dtype = costs.on_unit(accelerator(device, unit), work, n_weights)
    steps = [] if convert is None else [cpu("dequantize_s", "dequantize", convert.weight_bytes, convert.ops,
                                            costs.dtype, kernel="dequant")]
    return [*steps, compute(unit, phase, name, unit_work.weight_bytes, unit_work.ops, dtype, batch=batch,
                            kernel=kernel)]


def read(phase: str, name: str, n_requests: int, block_bytes: int, *, sequential: bool = False,
         span_bytes: int | None = None) -> Step:
    return Step(phase, "read", name, n_requests=int(n_requests), block_bytes=int(block_bytes), sequential=sequential,
                span_bytes=span_bytes)


def run_steps(m: Machine, steps: list[Step], stats: TokenStats) -> Event:
    """Run the steps one after another on the simulated machine (every I/O thread issues).

    When nothing else runs (:meth:`Machine.closed`) the steps' lengths are added on a local
    clock exactly as the simpy clock would advance, with the same bookings, and the
    stretch is one simpy event (the per-step path below is the reference; a test runs
    both ways).
    """
    env = m.env
    if m.closed():
        now = start = env.now
        for step in steps:
            if step.empty:
                continue
            t0 = now
            if step.kind == "cpu":
                now = now + m.closed_cpu(step.weight_bytes, step.ops, step.dtype, threads=step.threads,
                                         kernel=step.kernel, overhead_s=step.overhead_s)
            elif step.kind == "accel":
                now = m.closed_accel(now, step.unit, step.weight_bytes, step.ops, step.dtype, batch=step.batch)
            else:
                now = now + m.closed_read(now, step.n_requests, step.block_bytes, sequential=step.sequential,
                                          span_bytes=step.span_bytes, issuers=len(m.io_threads), blocking=True)
                stats.flash_bytes += step.n_requests * step.block_bytes
            stats.add_phase(step.phase, now - t0)
        if now > start:
            yield env.timeout(m.delay_until(now))
        return
    for step in steps:
        if step.empty:
            continue
        t0 = env.now
        if step.kind == "cpu":
            yield from m.cpu_parallel(step.name, step.weight_bytes, step.ops, step.dtype, threads=step.threads,
                                      kernel=step.kernel, overhead_s=step.overhead_s)
        elif step.kind == "accel":
            yield from m.accel_job(step.unit, step.name, step.weight_bytes, step.ops, step.dtype, batch=step.batch)
        else:
            yield from m.read(step.name, step.n_requests, step.block_bytes, sequential=step.sequential,
                              span_bytes=step.span_bytes, issuers=len(m.io_threads), blocking=True)
            stats.flash_bytes += step.n_requests * step.block_bytes
        stats.add_phase(step.phase, env.now - t0)


def steps_time_s(m: Machine, steps: list[Step], stats: TokenStats) -> float:
    """Closed-form time of the same steps (``--mode analytic``)."""
    total = 0.0
    cpu_agents = frozenset({"cpu"})
    io_cores = [th.core for th in m.io_threads]
    for step in steps:
        if step.empty:
            continue
        if step.kind == "cpu":
            seconds = m.parallel_time_s(step.weight_bytes, step.ops, step.dtype, cpu_agents, threads=step.threads,
                                        kernel=step.kernel, overhead_s=step.overhead_s)
        elif step.kind == "accel":
            seconds = m.accel_time_s(step.unit, step.weight_bytes, step.ops, step.dtype, frozenset({step.unit}),
                                     batch=step.batch)
        else:
            seconds = m.flash.parallel_batch_time_s(step.n_requests, step.block_bytes, io_cores,
                                                    sequential=step.sequential, span_bytes=step.span_bytes,
                                                    blocking=True)
            stats.flash_bytes += step.n_requests * step.block_bytes
        stats.add_phase(step.phase, seconds)
        total += seconds
    return total


def spread_threads(cores: list[str], n_threads: int) -> list[str]:
    """``n_threads`` thread placements, round-robin over a list of cores (cluster names)."""
    return [cores[i % len(cores)] for i in range(n_threads)] if cores else []
