"""Compute-time models (sim.hw.processors): rooflines for CPU cores, NPU and GPU."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.hw.processors import (
    accel_efficiency,
    accel_kernel_time_s,
    cpu_demand_gbps,
    cpu_kernel_time_s,
    cpu_parallel_time_s,
)
from sim.profiles.registry import load_device

DEVICE = load_device("oneplus-12")
CORES = st.sampled_from(DEVICE.cpu.clusters)
DTYPES = st.sampled_from(["int4", "int8", "fp16", "fp32"])
POSITIVE = st.floats(1e3, 1e10)


def rate(core, dtype: str, kernel: str = "dense_gemv") -> float:
    """The profile's rate for the dtype, times the core's measured speed of the kernel class."""
    base = core.int8_gops if dtype in ("int4", "int8") else core.fp32_gflops
    return base * getattr(core.kernel_speed, kernel) * 1e9


@settings(max_examples=60, deadline=None)
@given(core=CORES, dtype=DTYPES, weight_bytes=POSITIVE, ops=POSITIVE, bw=st.floats(0.5, 80.0))
def test_cpu_kernel_is_a_roofline(core, dtype, weight_bytes, ops, bw):
    t = cpu_kernel_time_s(core, weight_bytes, ops, bw, dtype)
    memory, compute = weight_bytes / (bw * 1e9), ops / rate(core, dtype)
    assert t == pytest.approx(max(memory, compute))
    # More bandwidth never hurts, and stops helping once compute-bound.
    assert cpu_kernel_time_s(core, weight_bytes, ops, bw * 2, dtype) <= t
    assert cpu_kernel_time_s(core, weight_bytes, ops, math.inf, dtype) == pytest.approx(compute)


def test_quantised_kernels_use_integer_throughput():
    big = DEVICE.cpu.cluster("big")
    ops = 1e9
    assert cpu_kernel_time_s(big, 1.0, ops, 1e6, "int4") == pytest.approx(ops / rate(big, "int4"))
    assert cpu_kernel_time_s(big, 1.0, ops, 1e6, "fp16") == pytest.approx(ops / rate(big, "fp16"))
    assert cpu_kernel_time_s(big, 0.0, 0.0, 10.0, "int4") == 0.0
    assert cpu_kernel_time_s(big, 0.0, ops, 10.0, "int4") == pytest.approx(ops / rate(big, "int4"))
    # the calibrated figure is the GEMM's (prefill); sparse GEMV has no figure and runs at it too
    assert cpu_kernel_time_s(big, 0.0, ops, 10.0, "int4", "gemm") == pytest.approx(ops / (big.int8_gops * 1e9))
    assert cpu_kernel_time_s(big, 0.0, ops, 10.0, "int4", "sparse_gemv") == pytest.approx(ops / (big.int8_gops * 1e9))


@settings(max_examples=40, deadline=None)
@given(core=CORES, dtype=DTYPES, weight_bytes=POSITIVE, ops=POSITIVE)
def test_demand_is_the_bandwidth_that_keeps_a_kernel_compute_bound(core, dtype, weight_bytes, ops):
    demand = cpu_demand_gbps(core, weight_bytes, ops, dtype)
    assert 0 < demand <= core.mem_gbps
    t = cpu_kernel_time_s(core, weight_bytes, ops, demand, dtype)
    assert t == pytest.approx(cpu_kernel_time_s(core, weight_bytes, ops, core.mem_gbps, dtype))


@settings(max_examples=40, deadline=None)
@given(cores=st.lists(CORES, min_size=1, max_size=8), dtype=DTYPES, weight_bytes=POSITIVE, ops=POSITIVE,
       bw=st.floats(1.0, 40.0))
def test_parallel_kernel_shares_work_by_speed(cores, dtype, weight_bytes, ops, bw):
    bws = [bw] * len(cores)
    t = cpu_parallel_time_s(cores, weight_bytes, ops, bws, dtype)
    alone = [cpu_kernel_time_s(c, weight_bytes, ops, bw, dtype) for c in cores]
    assert t <= min(alone) * (1 + 1e-12)
    assert t >= min(alone) / len(cores) * (1 - 1e-12)
    assert 1 / t == pytest.approx(sum(1 / a for a in alone))
    # One more thread never slows the phase down.
    assert cpu_parallel_time_s([*cores, cores[0]], weight_bytes, ops, [*bws, bw], dtype) <= t


def test_identical_threads_divide_the_time():
    mid = DEVICE.cpu.cluster("mid")
    one = cpu_parallel_time_s([mid], 1e8, 1e9, [10.0], "int4")
    four = cpu_parallel_time_s([mid] * 4, 1e8, 1e9, [10.0] * 4, "int4")
    assert four == pytest.approx(one / 4)


@pytest.mark.parametrize("unit", ["npu", "gpu"])
def test_accelerator_efficiency_follows_the_profile_curve(unit):
    acc = getattr(DEVICE, unit)
    for p in acc.efficiency:
        assert accel_efficiency(acc, p.batch) == pytest.approx(p.efficiency)
    first, last = acc.efficiency[0], acc.efficiency[-1]
    assert accel_efficiency(acc, last.batch * 10) == pytest.approx(last.efficiency)
    mid = int(math.sqrt(first.batch * last.batch))
    assert first.efficiency <= accel_efficiency(acc, mid) <= last.efficiency


@pytest.mark.parametrize("unit", ["npu", "gpu"])
def test_accelerator_kernel_is_launch_plus_roofline(unit):
    acc = getattr(DEVICE, unit)
    launch = acc.launch_overhead_us * 1e-6
    weight_bytes, ops, bw = 1e8, 1e9, 40.0
    for batch in (1, 16, 128):
        t = accel_kernel_time_s(acc, weight_bytes, ops * batch, bw, "int4", batch=batch)
        compute = ops * batch / (acc.int8_tops * 1e12 * accel_efficiency(acc, batch))
        assert t == pytest.approx(launch + max(weight_bytes / (bw * 1e9), compute))
    assert accel_kernel_time_s(acc, weight_bytes, ops, bw, "int4", launches=3) == pytest.approx(
        3 * launch + accel_kernel_time_s(acc, weight_bytes, ops, bw, "int4") - launch)
    assert accel_kernel_time_s(acc, 0.0, 0.0, bw, "int4") == 0.0


def test_batching_amortises_accelerator_time_per_token():
    """Prefill on the NPU: per-token time falls with the batch (efficiency grows) [PI2 §2.3]."""
    npu = DEVICE.npu
    per_token_ops, weights = 2 * 7e9, 3.5e9
    per_token = [accel_kernel_time_s(npu, weights, per_token_ops * b, npu.mem_gbps, "int4", batch=b) / b
                 for b in (1, 8, 64, 128)]
    assert all(b < a for a, b in itertools.pairwise(per_token))
