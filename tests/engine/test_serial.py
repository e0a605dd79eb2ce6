"""Sequential steps (sim/engine/strategies/serial.py): a CPU step's fixed per-call overhead.

The bundled OnePlus 12 machine runs a short list of steps three ways (a closed stretch on
a local clock, the per-step simpy events, the analytic sum); every assertion compares the
same steps with and without ``overhead_s``.
"""

from __future__ import annotations

import pytest
import simpy

from sim.engine.machine import Machine
from sim.engine.strategies.base import TokenStats
from sim.engine.strategies.serial import Step, cpu, read, run_steps, steps_time_s
from sim.profiles.registry import load_device

COMPUTE = ["big", "mid-hi", "mid-hi", "mid-hi"]


def steps(overhead_s: float) -> list[Step]:
    return [cpu("attention_s", "attention", 4e6, 8e6, "fp16"),
            read("io_s", "neuron-read", 200, 8192),
            cpu("memory_management_s", "memory-management", 2e6, 0, "fp16", threads=2, overhead_s=overhead_s),
            cpu("ffn_s", "ffn", 8e6, 16e6, "fp16")]


def des(overhead_s: float, closed: bool) -> tuple[float, TokenStats, Machine]:
    env = simpy.Environment()
    m = Machine(env, load_device("oneplus-12"), COMPUTE, COMPUTE)
    m.compiled_phases = closed
    stats = TokenStats()
    env.process(run_steps(m, steps(overhead_s), stats))
    env.run()
    return env.now, stats, m


def analytic(overhead_s: float) -> tuple[float, TokenStats]:
    m = Machine(simpy.Environment(), load_device("oneplus-12"), COMPUTE, COMPUTE)
    stats = TokenStats()
    return steps_time_s(m, steps(overhead_s), stats), stats


@pytest.mark.parametrize("closed", [True, False], ids=["closed stretch", "per-step events"])
def test_overhead_adds_exactly_itself_to_its_step_in_the_des(closed):
    overhead = 1.5e-3
    t0, s0, m0 = des(0.0, closed)
    t1, s1, m1 = des(overhead, closed)
    assert t1 - t0 == pytest.approx(overhead, rel=1e-9)
    assert s1.phase_s["memory_management_s"] - s0.phase_s["memory_management_s"] == pytest.approx(overhead,
                                                                                                  rel=1e-9)
    for phase in ("attention_s", "io_s", "ffn_s"):
        assert s1.phase_s[phase] == pytest.approx(s0.phase_s[phase], rel=1e-9)  # clock rounding only
    # the step's two threads (the fastest) are held, and busy, during it; the others are not
    added = {unit: m1.usage.busy_s[unit] - m0.usage.busy_s[unit] for unit in m0.usage.busy_s}
    held = [th.name for th in m0.threads_by_speed[:2]]
    for unit, extra in added.items():
        assert extra == pytest.approx(overhead if unit in held else 0.0, rel=1e-9, abs=1e-15), unit
    assert m1.usage.dram_bytes == m0.usage.dram_bytes  # no traffic beyond the bytes


def test_des_and_analytic_charge_the_overhead_alike():
    for overhead in (0.0, 2e-6, 0.05):
        total, stats = analytic(overhead)
        for closed in (True, False):
            now, des_stats, _ = des(overhead, closed)
            assert now == pytest.approx(total, rel=1e-12)
            for phase, seconds in stats.phase_s.items():
                assert des_stats.phase_s[phase] == pytest.approx(seconds, rel=1e-12, abs=1e-18), phase
    assert analytic(0.05)[0] - analytic(0.0)[0] == pytest.approx(0.05, rel=1e-12)


def test_zero_overhead_is_the_step_without_one():
    plain = [Step(s.phase, s.kind, s.name, weight_bytes=s.weight_bytes, ops=s.ops, dtype=s.dtype, threads=s.threads,
                  n_requests=s.n_requests, block_bytes=s.block_bytes) for s in steps(0.0)]
    assert plain == steps(0.0)


def test_a_step_with_only_an_overhead_is_not_empty_and_takes_it():
    only = cpu("memory_management_s", "memory-management", 0, 0, "fp16", overhead_s=3e-6)
    assert not only.empty
    assert cpu("memory_management_s", "memory-management", 0, 0, "fp16").empty
    m = Machine(simpy.Environment(), load_device("oneplus-12"), COMPUTE, COMPUTE)
    assert steps_time_s(m, [only], TokenStats()) == 3e-6


def test_only_a_cpu_step_carries_an_overhead():
    with pytest.raises(ValueError, match="only a CPU step"):
        Step("io_s", "read", "neuron-read", n_requests=10, block_bytes=4096, overhead_s=1e-6)
