"""The few figures a user reads after `sim profile-device`, as (quantity, value) rows."""

from __future__ import annotations

from sim.profiling.runner import FULL_DEPTH, Measurements
from sim.profiling.storage import KiB, MiB


def summary_rows(m: Measurements) -> list[tuple[str, str]]:
    """Headline figures, in the order a profile lists them."""
    rows: list[tuple[str, str]] = []
    for cl in m.topology.clusters:
        k = m.kernels[cl.name]
        rows += [
            (f"cpu {cl.name}: cores", str(len(cl.cpus))),
            (f"cpu {cl.name}: fp32 GEMM / GEMV / sparse GEMV", " / ".join(
                f"{k.fp32[x]:.1f}" for x in ("gemm", "dense_gemv", "sparse_gemv")) + " GFLOPS"),
            (f"cpu {cl.name}: int8 GEMM / GEMV / sparse GEMV", " / ".join(
                f"{k.int8[x]:.1f}" for x in ("gemm", "dense_gemv", "sparse_gemv")) + " GOPS"),
            (f"cpu {cl.name}: DRAM copy, one core", f"{m.dram_cluster[cl.name].gbps:.2f} GB/s"),
        ]
        if cl.name in m.cluster_io:
            rows.append((f"cpu {cl.name}: 4 KiB random issued here", f"{m.cluster_io[cl.name].gbps * 1e3:.0f} MB/s"))
    for n in sorted(m.dram_copy):
        rows.append((f"DRAM copy / triad, {n} thread(s)",
                     f"{m.dram_copy[n].gbps:.2f} / {m.dram_triad[n].gbps:.2f} GB/s"))
    rows += [
        ("page cache bypass", m.bypass),
        ("4 KiB random, 1 reader (latency)",
         f"{m.depths[1].gbps * 1e3:.0f} MB/s ({m.depths[1].latency_us:.0f} us)"),
        (f"4 KiB random, {FULL_DEPTH} readers", f"{m.rand[4 * KiB].gbps * 1e3:.0f} MB/s"),
    ]
    if MiB in m.seq:
        rows.append(("1 MiB sequential, 1 reader", f"{m.seq[MiB].gbps * 1e3:.0f} MB/s"))
    if MiB in m.rand:
        rows.append((f"1 MiB random, {FULL_DEPTH} readers", f"{m.rand[MiB].gbps * 1e3:.0f} MB/s"))
    if m.spread_io is not None:
        rows.append(("4 KiB random issued from every core", f"{m.spread_io.gbps * 1e3:.0f} MB/s"))
    return rows
