"""Summaries of a run: the figures users compare (tokens/s, latency tails, hit ratio)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

from sim.engine.steady_state import steady_state
from sim.engine.unit_labels import accelerator, unit_kind
from sim.profiles.device import DeviceProfile
from sim.profiles.memory import MemoryPlan


def summarise(tokens: pd.DataFrame, *, plan: MemoryPlan, device: DeviceProfile, prefill_s: float,
              prompt_tokens: int, busy_s: dict[str, float], warnings: list[str],
              decode_dram_bytes: float | None = None, prefill_busy_s: dict[str, float] | None = None,
              decode_flash_requests: int | None = None) -> dict[str, Any]:
    lat = tokens["latency_s"].to_numpy()
    decode_s = float(lat.sum())
    requests = int(tokens["requests"].sum())
    hits = int(tokens["hits"].sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        miss_ratio = np.where(tokens["requests"] > 0, tokens["misses"] / tokens["requests"], 0.0)
    steady = steady_state(lat)
    out: dict[str, Any] = {
        "decode_tokens_per_s": len(lat) / decode_s if decode_s > 0 else math.inf,
        # the 95% interval of the steady state's tokens/s (after the warm-up MSER-5 detects), sim.engine.steady_state
        "decode_tokens_per_s_ci": list(steady.ci) if steady.ci is not None else None,
        "steady_state": steady.as_dict(),
        "prefill_tokens_per_s": prompt_tokens / prefill_s if prefill_s and prefill_s > 0 else None,
        "ttft_s": prefill_s if prefill_s == prefill_s else None,
        "latency_ms_mean": float(lat.mean() * 1e3),
        "latency_ms_p50": float(np.percentile(lat, 50) * 1e3),
        "latency_ms_p99": float(np.percentile(lat, 99) * 1e3),
        "cache_hit_ratio": hits / requests if requests else 1.0,
        "cache_miss_ratio_mean": float(miss_ratio.mean()),
        "cache_miss_ratio_p99": float(np.percentile(miss_ratio, 99)),
        "flash_bytes_per_token": float(tokens["flash_bytes"].mean()),
        "memory": {"budget_bytes": plan.budget_bytes, **plan.resident, "neuron_cache": plan.neuron_cache_bytes,
                   "unused": plan.unused_bytes, "ffn_resident_fraction": plan.ffn_resident_fraction},
        # busy seconds are sums of float intervals: clip the last ulp that can push a saturated unit past 1
        "utilisation": {unit: (min(1.0, s / decode_s) if decode_s else 0.0) for unit, s in sorted(busy_s.items())}
        if busy_s else {},
        "phases_ms_per_token": {c[:-2]: float(tokens[c].mean() * 1e3) for c in tokens.columns
                                if c.endswith("_s") and not c.startswith("busy_") and c != "latency_s"},
        "warnings": list(warnings) + _thrash_warning(hits, requests, plan),
    }
    if prefill_busy_s and prefill_s and prefill_s > 0:  # which units the prompt kept busy (the DES only)
        out["prefill_utilisation"] = {unit: min(1.0, s / prefill_s) for unit, s in sorted(prefill_busy_s.items())}
    if decode_dram_bytes is not None and len(lat):
        out["dram_bytes_per_token"] = decode_dram_bytes / len(lat)  # weights streamed from DRAM to compute
    if device.power is not None and busy_s:
        out["energy_j_per_token"] = _energy_per_token(device, busy_s, decode_s, len(lat), tokens,
                                                      decode_dram_bytes or 0.0, decode_flash_requests)
    return out


def _io_cpu_seconds(device: DeviceProfile, busy_s: dict[str, float], flash_requests: int | None) -> dict[str, float]:
    """``busy_s`` with each I/O thread's time cut to the CPU work its reads cost.

    An I/O thread is busy (in the utilisation table) while its reads are in flight, but its
    core burns power only for the driver's work per request ([PI2 §2.3]: the CPU runs the
    UFS driver, so the issuing core sets the 4 KiB random-read rate). That rate bounds the
    work: at most ``page_bytes / io_4k_gbps`` of the core per request. The run's requests
    are shared among the I/O threads in proportion to their busy time.
    """
    io = {u: s for u, s in busy_s.items() if unit_kind(u)[0].startswith("io:")}
    total = sum(io.values())
    if flash_requests is None or total <= 0:
        return dict(busy_s)
    out = dict(busy_s)
    for unit, seconds in io.items():
        core = device.cpu.cluster(unit_kind(unit)[1] or "")
        per_request = device.storage.page_bytes / (core.io_4k_gbps * 1e9)
        out[unit] = min(seconds, flash_requests * seconds / total * per_request)
    return out


# Below this hit ratio, with at least THRASH_RESIDENT of the FFN's bytes given to the cache,
# the cache is not holding what it was sized for: said out loud, since "FFN resident" in
# the memory table would otherwise read as if those weights were being served from DRAM.
THRASH_HIT_RATIO = 0.05
THRASH_RESIDENT = 0.25


def _thrash_warning(hits: int, requests: int, plan: MemoryPlan) -> list[str]:
    if not requests or plan.ffn_resident_fraction < THRASH_RESIDENT or hits / requests >= THRASH_HIT_RATIO:
        return []
    return [f"the cache holds {plan.ffn_resident_fraction:.0%} of the FFN's bytes but serves only "
            f"{hits / requests:.1%} of requests: the access pattern cycles through more than the cache holds, "
            "so its policy evicts each item before its reuse (try --policy s3fifo or a larger budget)"]


def _energy_per_token(device: DeviceProfile, busy_s: dict[str, float], decode_s: float, n_tokens: int,
                      tokens: pd.DataFrame, dram_bytes: float, flash_requests: int | None = None) -> float:
    """Busy time x active power per unit, idle power over the run, and DRAM traffic at the
    profile's ``dram_w_per_gbps`` (W per GB/s is J per GB), all from the profile's figures."""
    assert device.power is not None
    joules = device.power.idle_w * decode_s + device.power.dram_w_per_gbps * dram_bytes / 1e9
    cluster_busy: dict[str, float] = defaultdict(float)
    for unit, seconds in _io_cpu_seconds(device, busy_s, flash_requests).items():
        _, cluster = unit_kind(unit)
        if cluster is not None:
            cluster_busy[cluster] += seconds
            continue
        if unit == "storage":
            watts = device.storage.active_w or 0.0
        elif unit in ("npu", "gpu"):
            acc = accelerator(device, unit)
            watts = (acc.active_w or 0.0) if acc else 0.0
        else:
            watts = 0.0
        joules += watts * seconds
    for name, seconds in cluster_busy.items():
        # More threads than cores (LLM in a Flash's 32 readers) share the cores: a cluster is
        # never charged for more than all its cores busy for the whole run.
        core = device.cpu.cluster(name)
        joules += (core.active_w or 0.0) * min(seconds, core.cores * decode_s)
    return joules / n_tokens if n_tokens else 0.0
