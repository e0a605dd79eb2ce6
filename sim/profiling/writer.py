"""Measurements -> a device-profile YAML whose every number says where it came from.

The text is written line by line rather than dumped, so each figure carries its comment
(``measured: <date>, <method>``), as the bundled profiles carry their sources; it is then
parsed and validated against :class:`~sim.profiles.device.DeviceProfile` before anyone
sees it. Figures the schema bounds are clamped into range, and the comment says so.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import yaml
from pydantic import ValidationError

from sim.errors import SimError
from sim.profiles.device import DeviceProfile
from sim.profiles.schema import MIN_RATE
from sim.profiling.runner import FULL_DEPTH, Measurements
from sim.profiling.storage import KiB, MiB
from sim.profiling.topology import cpuinfo_ghz

MAX_PENALTY = 0.95  # the schema wants multi_issuer_penalty < 1
MAX_RANGE_FACTOR = 1.5  # the schema's bound on range_effect factors
SATURATED = 0.95  # queue_depth: the fewest readers reaching this share of the best 4 KiB rate


def fmt(x: float) -> str:
    """Four significant digits, as a plain YAML float (``0.0001234`` rather than ``1.234e-04``)."""
    text = f"{x:.4g}"
    if "e" in text:
        text = f"{x:.10f}".rstrip("0")
    return text if "." in text or "e" in text else text + ".0"


def size(n: int) -> str:
    """``4KiB``, ``128MiB`` where exact, else the byte count."""
    for unit, scale in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", KiB)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def quoted(text: str) -> str:
    return '"' + " ".join(text.split()).replace("\\", "\\\\").replace('"', '\\"') + '"'


def device_kind() -> str:
    """phone on Android (Termux), laptop elsewhere (a label; the schema has no other word)."""
    return "phone" if "ANDROID_ROOT" in os.environ or Path("/system/build.prop").exists() else "laptop"


def queue_depth(m: Measurements) -> int:
    best = max(r.gbps for r in m.depths.values())
    return min(d for d, r in m.depths.items() if r.gbps >= SATURATED * best)


def cpu_label(cpus: tuple[int, ...]) -> str:
    return f"CPU {cpus[0]}" if len(cpus) == 1 else f"CPUs {','.join(map(str, cpus))}"


def profile_text(m: Measurements, name: str) -> str:
    """The profile as YAML text (validated: a failure is a bug here, reported as a SimError)."""
    s = m.settings
    topo = m.topology
    when = f"measured: {m.date}"
    bypass = f"page cache bypassed with {m.bypass}"
    pin_note = "pinned" if topo.can_pin else "not pinned (no sched_setaffinity here)"
    span_note = f"{size(m.span)} span"
    lines = [
        f"# Measured by `sim profile-device{' --quick' if s.quick else ''}` on {m.date}: {platform.system()} "
        f"{platform.release()}, {platform.machine()}, {topo.cpu_model}.",
        f"# Storage: a {size(s.file_bytes)} test file in {s.storage_dir}, {bypass}; every read figure is the best "
        f"of {s.repeats} run(s) of {s.measure_s:g} s.",
        "# No GPU or NPU figures: numpy cannot reach them; add gpu/npu sections from datasheets (see the bundled",
        "# profiles) if the runtime uses them. Power figures are not measured either.",
        f"name: {name}",
        f"description: {quoted(f'measured with sim profile-device on {m.date} ({topo.cpu_model})')}",
        f"soc: {quoted(topo.cpu_model)}",
        f"kind: {device_kind()}",
        "cpu:",
        "  clusters:",
    ]
    freq_fallback = cpuinfo_ghz()
    all_cpus = max(m.dram_copy)
    cpu_mem = max(r.gbps for r in m.dram_copy.values())
    for cl in topo.clusters:
        k = m.kernels[cl.name]
        gemm = max(k.int8["gemm"], MIN_RATE)
        if cl.max_freq_ghz is not None:
            freq, freq_src = cl.max_freq_ghz, "sysfs cpufreq/cpuinfo_max_freq"
        elif freq_fallback is not None:
            freq, freq_src = freq_fallback, "/proc/cpuinfo cpu MHz (cpufreq hidden); a label, not simulated"
        else:
            freq, freq_src = 1.0, "not exposed by the OS: a placeholder label, not simulated"
        ratios = {kind: min(100.0, max(MIN_RATE, k.int8[kind] / gemm)) for kind in ("dense_gemv", "sparse_gemv")}
        io = m.cluster_io.get(cl.name, m.rand[4 * KiB])
        io_how = (f"4 KiB random reads, {FULL_DEPTH} readers pinned to {cpu_label(cl.cpus[:1])}"
                  if cl.name in m.cluster_io else f"4 KiB random reads, {FULL_DEPTH} readers (not pinned)")
        mem = m.dram_cluster[cl.name]
        core = f"one {pin_note} core ({cpu_label(cl.cpus[:1])})"
        lines += [
            f"    - name: {cl.name}",
            f"      core: {quoted(topo.cpu_model)}",
            f"      cores: {len(cl.cpus)}  # {when}, {topo.method}: {cpu_label(cl.cpus)}",
            f"      freq_ghz: {fmt(freq)}  # {when}, {freq_src}",
            f"      fp32_gflops: {fmt(k.fp32['gemm'])}  # {when}, numpy fp32 GEMM (BLAS held to one thread) on {core}",
            f"      int8_gops: {fmt(gemm)}  # {when}, int8 GEMM (numba, int32 accumulate) on {core}",
            f"      mem_gbps: {fmt(mem.gbps)}  # {when}, numpy copy (STREAM bytes, CPU time), one thread on "
            f"{cpu_label(cl.cpus[:1])}",
            f"      kernel_speed: {{dense_gemv: {fmt(ratios['dense_gemv'])}, sparse_gemv: "
            f"{fmt(ratios['sparse_gemv'])}}}  # {when}, int8 GEMV over a cache-resident matrix and over gathered "
            f"rows, over the int8 GEMM rate (fp32: {k.fp32['dense_gemv'] / max(k.fp32['gemm'], MIN_RATE):.2f} "
            f"and {k.fp32['sparse_gemv'] / max(k.fp32['gemm'], MIN_RATE):.2f})",
            f"      io_4k_gbps: {fmt(io.gbps)}  # {when}, {io_how}, {span_note}, {m.bypass}",
        ]
    lines.append(f"  mem_gbps: {fmt(cpu_mem)}  # {when}, numpy copy (STREAM bytes, CPU time), best of "
                 f"1..{all_cpus} threads, one per core")
    peak = max([cpu_mem, *(r.gbps for r in m.dram_triad.values()), *(r.gbps for r in m.dram_cluster.values())])
    total = m.mem_total_bytes or 0
    usable = min(m.mem_available_bytes or total, total)
    lines += [
        "dram:",
        f"  type: {quoted('measured, not named (the OS does not say)')}",
        f"  total_bytes: {total}  # {when}, sysconf physical pages x page size",
        f"  usable_bytes: {usable}  # {when}, MemAvailable while profiling (what one app may take without swapping)",
        f"  peak_gbps: {fmt(peak)}  # {when}, the highest streaming figure seen (copy or triad, any thread count): "
        "no datasheet peak",
        f"  combined_gbps: {fmt(cpu_mem)}  # {when}, as cpu.mem_gbps: only the CPU streams here",
    ]
    bd = m.block_device
    label = f"{bd.name or 'unknown device'} holding {s.storage_dir}"
    lines += [
        "storage:",
        f"  type: {quoted(label)}",
        f"  capacity_bytes: {m.disk_total_bytes or s.file_bytes}  # {when}, size of the filesystem holding the "
        "test file",
        f"  page_bytes: 4KiB  # {when}: the OS page the runtime reads; logical block "
        f"{bd.logical_block_bytes if bd.logical_block_bytes else 'not exposed'} B (sysfs)",
        "  seq_read:",
    ]
    for block, r in sorted(m.seq.items()):
        lines.append(f"    - {{block: {size(block)}, gbps: {fmt(max(r.gbps, MIN_RATE))}}}  # {when}, sequential "
                     f"{size(block)} reads, one reader, whole file, {m.bypass}")
    lines.append("  rand_read:")
    for block, r in sorted(m.rand.items()):
        lines.append(f"    - {{block: {size(block)}, gbps: {fmt(max(r.gbps, MIN_RATE))}}}  # {when}, random "
                     f"{size(block)} reads, {FULL_DEPTH} readers, {span_note}, {m.bypass}")
    lines.append("  range_effect:")
    base = max(m.spans[m.span].gbps, MIN_RATE)
    for span, r in sorted(m.spans.items()):
        factor = r.gbps / base
        clamp = f" (clamped from {factor:.3g})" if factor > MAX_RANGE_FACTOR else ""
        lines.append(f"    - {{span: {size(span)}, factor: {fmt(max(MIN_RATE, min(MAX_RANGE_FACTOR, factor)))}}}  "
                     f"# {when}, 4 KiB random at {FULL_DEPTH} readers over {size(span)} / over {size(m.span)}{clamp}")
    qd = queue_depth(m)
    depths = ", ".join(f"{d}: {r.gbps:.3g}" for d, r in sorted(m.depths.items()))
    if bd.hw_queues:
        queues, q_src = bd.hw_queues, f"{when}, blk-mq hardware queues of {bd.name} (sysfs)"
    else:
        queues, q_src = 1, "assumed: sysfs shows no blk-mq queues here; one, as UFS has"
    lat = m.depths[1].latency_us
    lines += [
        f"  queue_depth: {qd}  # {when}, fewest concurrent readers reaching {SATURATED:.0%} of the best 4 KiB random "
        f"rate (GB/s by readers: {depths})",
        f"  command_queues: {queues}  # {q_src}",
        f"  read_latency_us: {fmt(lat)}  # {when}, mean 4 KiB random read, one reader, {span_note}, {m.bypass}",
    ]
    if m.spread_io is not None and m.cluster_io:
        one = max(r.gbps for r in m.cluster_io.values())
        raw = 1 - m.spread_io.gbps / one if one > 0 else 0.0
        pen = min(MAX_PENALTY, max(0.0, raw))
        lines.append(f"  multi_issuer_penalty: {fmt(pen)}  # {when}, 1 - 4 KiB random rate issued from every core "
                     f"({m.spread_io.gbps:.3g} GB/s) over the best from one core ({one:.3g}), within 0..0.95")
    else:
        lines.append("  multi_issuer_penalty: 0.0  # assumed: one core (or no pinning), nothing to compare")
    text = "\n".join(lines) + "\n"
    check(text, name)
    return text


def check(text: str, name: str) -> DeviceProfile:
    try:
        return DeviceProfile.model_validate(yaml.safe_load(text))
    except (ValidationError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[:3]
        raise SimError(f"the measured profile is not schema-valid (a bug in sim.profiling): {' '.join(first)}",
                       source=name) from None
