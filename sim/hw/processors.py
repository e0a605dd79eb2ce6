"""Compute-time models for CPU cores, NPU and GPU, from the device profile alone.

A kernel's time is a roofline: the larger of its weight bytes over the bandwidth the
unit gets right now and its operations over the unit's throughput. CPU throughput is
per core (``int8_gops`` for quantised kernels, ``fp32_gflops`` for float ones); GPU and
NPU throughput scales with the batch (rows per product) through the profile's measured
efficiency curve, and every accelerator call pays a launch / graph-switch overhead.
"""

from __future__ import annotations

from sim.hw.curves import linlog_interp
from sim.profiles.device import Accelerator, CpuCluster

QUANTISED = {"int8", "int4"}
# CPU kernel classes (see sim.profiles.device.KernelSpeed): batch-1 products over whole
# matrices, batch-1 products over gathered neuron rows, and batched products (prefill).
KERNELS = ("dense_gemv", "sparse_gemv", "gemm", "dequant")
# Converting one quantised weight for an accelerator: unpack it, apply its group's scale and
# minimum, store it (assumed: one multiply-add, i.e. 2 operations, at the int8 rate times
# kernel_speed.dequant; no microbenchmark in the brief measures it).
DEQUANT_OPS_PER_WEIGHT = 2.0


def cpu_rate_gops(core: CpuCluster, dtype: str, kernel: str = "dense_gemv") -> float:
    """Operations per second (in G) one core sustains on ``kernel`` in ``dtype``."""
    base = core.int8_gops if dtype in QUANTISED else core.fp32_gflops
    return base * getattr(core.kernel_speed, kernel)


def cpu_kernel_time_s(core: CpuCluster, weight_bytes: float, ops: float, bandwidth_gbps: float,
                      dtype: str, kernel: str = "dense_gemv") -> float:
    """One CPU thread streaming ``weight_bytes`` and doing ``ops`` operations."""
    if weight_bytes <= 0 and ops <= 0:
        return 0.0
    memory_s = weight_bytes / (bandwidth_gbps * 1e9) if weight_bytes > 0 else 0.0
    return max(memory_s, ops / (cpu_rate_gops(core, dtype, kernel) * 1e9))


def cpu_demand_gbps(core: CpuCluster, weight_bytes: float, ops: float, dtype: str,
                    kernel: str = "dense_gemv") -> float:
    """DRAM bandwidth one thread would use on this kernel: its core's reach, or less when
    the kernel is compute-bound (it streams weights only as fast as it multiplies them)."""
    if ops <= 0:
        return core.mem_gbps
    return min(core.mem_gbps, cpu_rate_gops(core, dtype, kernel) * weight_bytes / ops)


def accel_format(acc: Accelerator, dtype: str) -> str | None:
    """The format quantised ``dtype`` weights are converted to before ``acc`` computes on them
    (the narrowest wider format it takes: int8 for int4 weights if it can, else fp16), or
    None when it takes them as they are. Float weights always run as they are."""
    if dtype in acc.formats or dtype not in QUANTISED:
        return None
    return "int8" if dtype == "int4" and "int8" in acc.formats else "fp16"


def accel_efficiency(acc: Accelerator, batch: int) -> float:
    xs = [p.batch for p in acc.efficiency]
    ys = [p.efficiency for p in acc.efficiency]
    value, _ = linlog_interp(max(batch, 1), xs, ys)
    return value


def accel_kernel_time_s(acc: Accelerator, weight_bytes: float, ops: float, bandwidth_gbps: float,
                        dtype: str, batch: int = 1, launches: int = 1) -> float:
    """An accelerator call: launch overhead plus the roofline at this batch's efficiency."""
    if weight_bytes <= 0 and ops <= 0:
        return 0.0
    peak = acc.int8_tops if dtype in QUANTISED else acc.fp16_tflops
    compute = ops / (peak * 1e12 * accel_efficiency(acc, batch))
    return launches * acc.launch_overhead_us * 1e-6 + max(weight_bytes / (bandwidth_gbps * 1e9), compute)


def cpu_parallel_time_s(cores: list[CpuCluster], weight_bytes: float, ops: float, thread_gbps: list[float],
                        dtype: str, kernel: str = "dense_gemv") -> float:
    """A kernel shared by several threads that take work in proportion to their speed."""
    alone = [cpu_kernel_time_s(c, weight_bytes, ops, bw, dtype, kernel)
             for c, bw in zip(cores, thread_gbps, strict=True)]
    if not alone or min(alone) <= 0:
        return 0.0
    return 1.0 / sum(1.0 / a for a in alone)
