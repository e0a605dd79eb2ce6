"""Our policies against libCacheSim (the optional ``reference`` extra, GPLv3: tests only).

With one key per step the batched step model reduces to the classic one, so on identical
request streams our LRU, FIFO, LFU, CLOCK, S3-FIFO, SIEVE, ARC and Belady must produce
exactly libCacheSim's hits, request by request for the online policies.

Known differences, kept out of these streams on purpose:
- libCacheSim's S3FIFO aborts the whole process when ``int(0.1 * capacity)`` is 0 and
  never admits objects as large as its small queue, so S3-FIFO capacities here are >= 20.
- Belady: libCacheSim inserts every miss (our ``bypass=False``); our default also bypasses
  misses needed later than everything resident, which can only remove misses; the test
  checks both the equality and that bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cache_helpers import toy_trace

from sim.cache import make_policy
from sim.cache.belady import next_use
from sim.cache.layout import CacheLayout

lcs = pytest.importorskip("libcachesim")

ONLINE = {"lru": "LRU", "fifo": "FIFO", "lfu": "LFU", "clock": "Clock", "s3fifo": "S3FIFO", "sieve": "Sieve",
          "arc": "ARC"}


def _streams() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    n = 4000
    hot_scan = np.where(rng.random(n) < 0.5, rng.integers(0, 12, n), 12 + np.arange(n) % 150)
    trace = toy_trace(n_tokens=12, n_layers=2, n_experts=4, top_k=2, n_neurons=48, seed=3)
    layout = CacheLayout.from_meta(trace.meta)
    neurons = np.concatenate([b.items for b in layout.blocks(trace)])  # a real neuron stream, one key a step
    return {"zipf": (rng.zipf(1.2, n) - 1) % 300, "uniform": rng.integers(0, 120, n), "hot+scan": hot_scan,
            "neurons": neurons}


STREAMS = _streams()


def _lcs_hits(cls_name: str, capacity: int, keys: np.ndarray, sizes: np.ndarray,
              next_access: np.ndarray | None = None) -> np.ndarray:
    cache = getattr(lcs, cls_name)(capacity, hashpower=14)  # default 2**24 buckets: slow to allocate
    req = lcs.Request()
    out = np.empty(keys.shape[0], dtype=bool)
    for i, k in enumerate(keys.tolist()):
        req.obj_id = k
        req.obj_size = int(sizes[k])
        if next_access is not None:
            req.next_access_vtime = int(next_access[i])
        out[i] = cache.get(req)
    return out


@pytest.mark.parametrize("stream", sorted(STREAMS))
@pytest.mark.parametrize("policy", sorted(ONLINE))
def test_online_policies_hit_for_hit(policy, stream):
    keys = STREAMS[stream].astype(np.int64)
    n = int(keys.max()) + 1
    offsets = np.arange(keys.shape[0] + 1, dtype=np.int64)
    sizes = np.ones(n, dtype=np.int64)
    for capacity in (20, 64, max(20, n // 2)):
        ours = make_policy(policy, capacity, n, sizes).run(keys, offsets).hit
        ref = _lcs_hits(ONLINE[policy], capacity, keys, sizes)
        assert ours.sum() == ref.sum(), (policy, stream, capacity)
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("policy", sorted(ONLINE))
def test_online_policies_with_object_sizes(policy):
    """Beyond the issue's unit sizes: byte capacities with objects of 1..9 bytes."""
    keys = STREAMS["zipf"].astype(np.int64)
    n = int(keys.max()) + 1
    sizes = np.random.default_rng(1).integers(1, 10, n)
    offsets = np.arange(keys.shape[0] + 1, dtype=np.int64)
    for capacity in (53, 400):
        ours = make_policy(policy, capacity, n, sizes).run(keys, offsets).hit
        np.testing.assert_array_equal(ours, _lcs_hits(ONLINE[policy], capacity, keys, sizes))


def _oracle_general(keys: np.ndarray, tmp_path: Path):
    """libCacheSim's own route: CSV trace -> oracleGeneral (adds next-access times)."""
    csv = tmp_path / "requests.csv"
    csv.write_text("time,obj_id,obj_size\n" + "".join(f"{i + 1},{k},1\n" for i, k in enumerate(keys.tolist())))
    params = lcs.ReaderInitParam(has_header=True, has_header_set=True, delimiter=",")
    params.time_field, params.obj_id_field, params.obj_size_field = 1, 2, 3
    reader = lcs.TraceReader(str(csv), lcs.TraceType.CSV_TRACE, params)
    out = tmp_path / "requests.oracleGeneral"
    lcs.Util.convert_to_oracleGeneral(reader._reader, str(out))  # the binding takes the raw reader
    return lcs.TraceReader(str(out), lcs.TraceType.ORACLE_GENERAL_TRACE)


@pytest.mark.parametrize("stream", sorted(STREAMS))
def test_belady_matches_libcachesim_oracle_general(stream, tmp_path):
    keys = STREAMS[stream].astype(np.int64)
    n = int(keys.max()) + 1
    offsets = np.arange(keys.shape[0] + 1, dtype=np.int64)
    nu = next_use(keys, offsets)
    oracle = _oracle_general(keys, tmp_path)
    for capacity in (5, 20, 64, max(20, n // 2)):
        miss_ratio, _ = lcs.Belady(capacity, hashpower=14).process_trace(oracle)
        ref_hits = round((1.0 - miss_ratio) * keys.shape[0])
        insert_all = make_policy("belady", capacity, n, bypass=False).run(keys, offsets, next_use=nu).hit
        assert int(insert_all.sum()) == ref_hits, (stream, capacity)
        with_bypass = make_policy("belady", capacity, n).run(keys, offsets, next_use=nu).hit
        assert int(with_bypass.sum()) >= ref_hits


def test_belady_request_by_request_with_next_access_times():
    """Same check through Request.next_access_vtime, hit for hit."""
    keys = STREAMS["zipf"].astype(np.int64)
    n = int(keys.max()) + 1
    offsets = np.arange(keys.shape[0] + 1, dtype=np.int64)
    nu = next_use(keys, offsets)
    ref_next = np.where(nu == np.iinfo(np.int64).max, nu, nu // 2)  # one key a step: key = 2 * step
    for capacity in (10, 100):
        ours = make_policy("belady", capacity, n, bypass=False).run(keys, offsets, next_use=nu).hit
        np.testing.assert_array_equal(ours, _lcs_hits("Belady", capacity, keys, np.ones(n, np.int64), ref_next))
