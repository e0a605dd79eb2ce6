"""What binds a decode token: per phase, the resource on its critical path, with its share of the time.

The run books each unit's busy seconds per token; the phases are either barrier phases on
the compute threads (the strategy's ``cpu_phases``: attention, predictor, LM head) or
overlapped ones (the FFN: CPU clusters, flash reads and accelerators in a pipeline). A
barrier phase is limited by the CPU: its compute, or DRAM bandwidth when the CPU's work
streamed its bytes at (nearly) the CPU's DRAM figure. In the overlapped phases a pipeline
runs at its slowest stage, so the resources are taken busiest first, each limiting the
token for its busy time not already covered; what no unit covers is waiting (latency,
dependencies). Flash time is named by the limit :class:`~sim.hw.flash.FlashModel` applies
at the run's request mix (mean request size): the device's curve, the issuing core's
request rate (it runs the UFS driver, [PI2 §2.3]) or the command queue's depth (Little's
law), whichever is lowest. A "flash-bound" run whose issuing core binds is then reported
as such, and making the flash faster is seen to change nothing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sim.engine.unit_labels import unit_kind
from sim.profiles.device import DeviceProfile

DRAM_BOUND = 0.85  # of the CPU's DRAM figure: streaming at least this fast is bandwidth-bound
WAITING = "waiting (latency, dependencies)"
TINY = 1e-6  # of a phase's time


def flash_limit(device: DeviceProfile, block_bytes: float, io_clusters: list[str]) -> str:
    """The limit on flash throughput at requests of ``block_bytes`` issued from ``io_clusters``."""
    from sim.hw.flash import FlashModel

    flash = FlashModel(device)
    block = max(1, int(round(block_bytes)))
    dev = flash.device_gbps(block)
    core = min((device.cpu.cluster(c) for c in io_clusters), key=lambda c: c.io_4k_gbps)
    limits = {f"flash device ({block / 1024:.0f} KiB reads)": dev,
              f"I/O core issue rate ({core.name})": flash.issuer_gbps(block, core),
              "command queue depth": flash.queue_gbps(block, dev)}
    return min(limits, key=lambda k: limits[k])


def bottleneck(phases_s: dict[str, float], busy_s: dict[str, float], decode_s: float, *, device: DeviceProfile,
               cpu_phases: tuple[str, ...], dram_bytes: float | None, flash_bytes: float,
               flash_requests: int | None) -> dict[str, Any] | None:
    """``{"token": {"resource", "shares"}, "phases": {phase: {"resource", "shares"}}}`` from a
    run's decode totals (seconds per phase and per unit); None without busy times (analytic)."""
    if not busy_s or decode_s <= 0:
        return None
    compute = [s for u, s in busy_s.items() if unit_kind(u)[0].startswith("cpu:")]
    io_clusters = sorted({c for u in busy_s if unit_kind(u)[0].startswith("io:") for c in [unit_kind(u)[1]] if c})
    pool_s = sum(compute) / len(compute) if compute else 0.0
    barrier_s = sum(s for p, s in phases_s.items() if p in cpu_phases)
    cpu_label = "CPU compute"
    if dram_bytes and pool_s > 0:
        from sim.hw.dram import DramModel

        if dram_bytes / pool_s / 1e9 >= DRAM_BOUND * DramModel(device).solo_gbps("cpu"):
            cpu_label = "DRAM bandwidth"
    # overlapped phases: the resources' busy time there, busiest first
    stages: dict[str, float] = defaultdict(float)
    stages[cpu_label] += max(0.0, pool_s - barrier_s)
    if busy_s.get("storage", 0.0) > 0:
        block = flash_bytes / flash_requests if flash_requests else float(device.storage.page_bytes)
        stages[flash_limit(device, block, io_clusters or [device.cpu.clusters[0].name])] += busy_s["storage"]
    for unit in ("npu", "gpu"):
        if busy_s.get(unit, 0.0) > 0:
            stages[unit.upper()] += busy_s[unit]
    overlapped = {p: s for p, s in phases_s.items() if p not in cpu_phases and s > 0}
    over_s = sum(overlapped.values())
    covered = 0.0
    over_shares: dict[str, float] = {}
    for name, s in sorted(stages.items(), key=lambda kv: -kv[1]):
        take = min(s, over_s - covered)
        if take > TINY * over_s:  # a rounding's worth of busy time names nothing
            over_shares[name] = take
            covered += take
    if over_s - covered > TINY * over_s:
        over_shares[WAITING] = over_s - covered
    phases: dict[str, dict[str, Any]] = {}
    token: dict[str, float] = defaultdict(float)
    for phase, s in phases_s.items():
        if s <= 0:
            continue
        if phase in cpu_phases:
            shares = {cpu_label: 1.0}
        else:
            shares = {k: v / over_s for k, v in over_shares.items()} if over_s else {WAITING: 1.0}
        phases[phase.removesuffix("_s")] = {"resource": max(shares, key=lambda k: shares[k]), "shares": shares}
        for k, v in shares.items():
            token[k] += v * s / decode_s
    return {"token": {"resource": max(token, key=lambda k: token[k]) if token else "-", "shares": dict(token)},
            "phases": phases}
