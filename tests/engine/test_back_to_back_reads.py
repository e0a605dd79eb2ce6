"""Flash batches queued on PowerInfer-2's single I/O thread run back-to-back (issue 23).

UFS keeps a command queue, so a batch waiting behind another has its commands queued while
that one transfers: it starts the instant the other ends and costs only its transfer. A
batch that finds the device idle pays the read latency first. The simpy reference
(``Machine.read``), the compiled FFN phase (``schedule_ffn_phase``) and the flash model
must charge this identically; these tests pin the rule in each.
"""

from __future__ import annotations

import engine_helpers as h
import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.cluster_schedule import schedule_ffn_phase
from sim.engine.machine import Machine

DEVICE = h.device()  # the OnePlus 12: one UFS command queue, 80 us read latency
IO_CORE = "mid-hi"
BLOCKS = st.sampled_from([4096, 8192, 24576, 131072])


def _machine(env: simpy.Environment, fast_paths: bool = True) -> Machine:
    m = Machine(env, DEVICE, ["mid"], [IO_CORE], record_spans=True)
    m.fast_paths = fast_paths
    return m


def _transfer(m: Machine, n: int, block: int) -> float:
    return m.flash.batch_time_s(n, block, DEVICE.cpu.cluster(IO_CORE), back_to_back=True)


def _storage_spans(m: Machine) -> list[tuple[float, float]]:
    return sorted((s.start_s, s.end_s) for s in m.spans if s.unit == "storage")


@pytest.mark.parametrize("fast_paths", [True, False])
def test_two_batches_issued_together_take_one_latency_plus_both_transfers(fast_paths):
    env = simpy.Environment()
    m = _machine(env, fast_paths)
    assert m.storage.capacity == 1 and m.flash.latency_s > 0
    env.process(m.read("a", 30, 4096))
    env.process(m.read("b", 7, 8192))
    env.run()
    t_a, t_b = _transfer(m, 30, 4096), _transfer(m, 7, 8192)
    assert env.now == pytest.approx(m.flash.latency_s + t_a + t_b, rel=1e-12)
    (a0, a1), (b0, b1) = _storage_spans(m)
    assert a0 == 0.0  # the first found the device idle
    assert b0 == a1  # back-to-back: the second starts the instant the first ends
    assert b1 - b0 == pytest.approx(t_b, rel=1e-12)  # and pays no latency
    assert m.usage.busy_s["storage"] == pytest.approx(env.now, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(n1=st.integers(1, 2000), n2=st.integers(1, 2000), b1=BLOCKS, b2=BLOCKS,
       gap_share=st.floats(0.0, 2.0), fast_paths=st.booleans())
def test_a_queued_batch_never_costs_more_than_on_an_idle_device(n1, n2, b1, b2, gap_share, fast_paths):
    """The second batch is issued ``gap`` after the first: still queued (it runs
    back-to-back, transfer only) or after the device went idle (latency + transfer, as
    alone); either way never dearer than the same batch alone on an idle device."""
    alone_env = simpy.Environment()
    alone = _machine(alone_env, fast_paths)
    alone_env.process(alone.read("b", n2, b2))
    alone_env.run()
    idle_cost = alone_env.now

    env = simpy.Environment()
    m = _machine(env, fast_paths)
    first = m.flash.batch_time_s(n1, b1, DEVICE.cpu.cluster(IO_CORE))
    gap = gap_share * first

    def later():
        yield env.timeout(gap)
        yield from m.read("b", n2, b2)

    env.process(m.read("a", n1, b1))
    env.process(later())
    env.run()
    (_, a1), (s0, s1) = _storage_spans(m)
    cost = s1 - s0
    assert cost <= idle_cost * (1 + 1e-12)
    if gap < a1:  # it waited: back-to-back, only its transfer
        assert s0 == a1
        assert cost == pytest.approx(_transfer(m, n2, b2), rel=1e-9)
    else:
        assert cost == pytest.approx(idle_cost, rel=1e-12)


def _phase(gate_reads: list[int], latency_s: float, gbps: float, block: float = 4096.0) -> tuple[float, float]:
    """(end, I/O busy) of a compiled FFN phase at t=0 whose clusters only read (no compute)."""
    n = len(gate_reads)
    threads = np.array([10.0])
    busy, io_busy = np.zeros(1), np.zeros(1)
    end = schedule_ffn_phase(0.0, np.array(gate_reads, dtype=np.int64), np.zeros(n, dtype=np.int64),
                             np.zeros((n, 2)), np.zeros((n, 2)), np.zeros(n, dtype=np.bool_), threads, threads,
                             50.0, 50.0, 0.0, latency_s, block, gbps, block, gbps, busy, io_busy)
    return end, float(io_busy[0])


def test_compiled_phase_charges_the_latency_once_for_batches_queued_back_to_back():
    latency, gbps, block = 80e-6, 1.0, 4096.0
    end, io_busy = _phase([30, 7, 12], latency, gbps, block)
    transfers = sum(n * block / (gbps * 1e9) for n in (30, 7, 12))
    assert end == pytest.approx(latency + transfers, rel=1e-12)
    assert io_busy == pytest.approx(end, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(reads=st.lists(st.integers(0, 500), min_size=1, max_size=12), latency_us=st.floats(0.0, 500.0))
def test_compiled_phase_pays_at_most_one_latency_when_every_read_is_queued_at_once(reads, latency_us):
    """All clusters ask at the start, so after the first every batch is queued: the phase
    costs one latency plus the transfers, never a latency per batch."""
    gbps, block = 1.5, 8192.0
    end, _ = _phase(reads, latency_us * 1e-6, gbps, block)
    transfers = sum(n * block / (gbps * 1e9) for n in reads)
    expect = (latency_us * 1e-6 if any(reads) else 0.0) + transfers
    assert end == pytest.approx(expect, rel=1e-9, abs=1e-15)
