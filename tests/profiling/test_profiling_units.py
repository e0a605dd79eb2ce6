"""Pieces of the profiler whose behaviour does not depend on the machine's speed."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.profiles.diff import diff_rows, flatten
from sim.profiles.registry import load_device
from sim.profiling import cpu, dram, storage, topology, writer
from sim.profiling.storage import KiB, MiB


@given(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False))
def test_fmt_is_a_yaml_float_within_four_digits(x):
    text = writer.fmt(x)
    assert "e" not in text and "." in text
    assert float(text) == pytest.approx(x, rel=1e-3, abs=1e-6)


@given(st.integers(min_value=1, max_value=2**40))
def test_size_round_trips_through_the_profile_parser(n):
    from sim.units import parse_bytes

    assert parse_bytes(writer.size(n)) == n


@given(st.lists(st.integers(min_value=0, max_value=255), min_size=1, max_size=20, unique=True))
def test_parse_cpu_list(cpus):
    text = ",".join(map(str, sorted(cpus)))
    assert topology.parse_cpu_list(text) == sorted(cpus)
    assert topology.parse_cpu_list("0-3,6") == [0, 1, 2, 3, 6]


@settings(max_examples=25, deadline=None)
@given(st.floats(min_value=0.05, max_value=20).filter(lambda s: 80 * s != 80))  # 1: no edit, so no row
def test_diff_ratio_is_the_edit(scale):
    a = load_device("oneplus-12")
    b = a.model_copy(update={"storage": a.storage.model_copy(update={"read_latency_us": 80 * scale})})
    rows = {r["field"]: r for r in diff_rows(a, b)}
    assert rows["storage.read_latency_us"]["ratio"] == pytest.approx(scale)
    others = [r for f, r in rows.items() if f != "storage.read_latency_us" and r["ratio"] is not None]
    assert others and all(r["ratio"] == 1 for r in others)
    assert len(diff_rows(a, b, all_fields=False)) == 1


def test_flatten_keys_list_entries_by_what_names_them():
    flat = flatten(load_device("oneplus-12").model_dump(mode="json"))
    assert flat["cpu.clusters[big].cores"] == 1
    assert flat["storage.rand_read[4KiB].gbps"] == 1.0
    assert flat["storage.range_effect[512MiB].factor"] == 0.85


def test_cluster_names_are_unique_schema_words():
    for n in range(1, 9):
        names = topology.cluster_names(n)
        assert len(names) == len(set(names)) == n


def test_topology_covers_the_usable_cpus_once():
    topo = topology.read_topology()
    assert sorted(topo.cpus) == topology.allowed_cpus()


def test_probe_file_is_written_and_removed(tmp_path):
    with storage.ProbeFile(tmp_path, 2 * MiB) as pf:
        path = pf.create()
        assert path.stat().st_size == 2 * MiB and path.name.startswith(storage.PROBE_PREFIX)
        method = storage.cache_bypass(path, 2 * MiB)
        result = storage.measure_reads(path, method, block=4 * KiB, span=2 * MiB, readers=3, duration_s=0.02)
        assert result.requests >= 3 and result.gbps > 0 and result.latency_us > 0
    assert list(tmp_path.iterdir()) == []


def test_probe_file_is_removed_when_the_block_raises(tmp_path):
    with pytest.raises(KeyboardInterrupt), storage.ProbeFile(tmp_path, MiB) as pf:
        pf.create()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise")
def test_fadvise_fallback_reads_the_file(tmp_path):
    with storage.ProbeFile(tmp_path, MiB) as pf:
        path = pf.create()
        r = storage.measure_reads(path, storage.FADVISE, block=64 * KiB, span=MiB, pattern="seq", duration_s=0.02)
        assert r.requests >= 1 and r.gbps > 0


def test_stream_counts_threads_and_kernels():
    for kind in ("copy", "triad"):
        r = dram.stream_bandwidth(kind, threads=2, array_bytes=MiB, passes=2)
        assert r.gbps > 0 and r.threads == 2 and r.kernel == kind


def test_int8_kernels_compute_the_products():
    import numpy as np

    rng = np.random.default_rng(1)
    w = rng.integers(-127, 128, (8, 32), dtype=np.int8)
    x = rng.integers(-127, 128, 32, dtype=np.int8)
    rows = np.array([1, 5, 6], dtype=np.int64)
    out = np.empty(8, np.int32)
    cpu._gemv_i8(w, x, out)
    assert (out == w.astype(np.int32) @ x.astype(np.int32)).all()
    cpu._sparse_gemv_i8(w, rows, x, out[:3])
    assert (out[:3] == w[rows].astype(np.int32) @ x.astype(np.int32)).all()
    m = np.empty((8, 8), np.int32)
    cpu._gemm_i8(w, w, m)
    assert (m == w.astype(np.int32) @ w.astype(np.int32).T).all()
