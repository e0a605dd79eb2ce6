"""The engine's speed-ups change no result.

- Machine fast paths (taking a free thread or queue slot without a simpy event when
  nothing else is due at that instant) against the plain event path;
- per-token vectorised trace decoding against the straightforward per-layer version;
- the compiled cluster split and the scratch-mask "fired" test against simple loops;
- a lazily generated trace replayed from memory against the materialised trace.
"""

from __future__ import annotations

import itertools

import engine_helpers as h
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.machine import Machine
from sim.engine.scheduler import MAX_EPOCH, PLACEMENT, placement_flags, route_neurons, split_clusters, top_share
from sim.engine.simulation import simulate
from sim.engine.trace_replay import ReplayTrace
from sim.engine.workload import LayerWork, TokenWork, iter_token_layers, popularity
from sim.errors import SimError
from sim.traces.format import Trace, TraceChunk, TraceMeta
from sim.traces.params import SynthDims
from sim.traces.synth import synth_trace


def multi_queue_device():
    data = h.device_data()
    data["storage"]["command_queues"] = 4
    return h.device(data)


CONFIGS = {
    "powerinfer2 default": (None, h.TINY_MOE, "powerinfer2", {"offload": 0.5}),
    "powerinfer2 small clusters, 3 io threads, 4 queues": (
        "multi", h.TINY_MOE, "powerinfer2",
        {"offload": 0.8,
         "knobs": {"cluster_neurons": 16, "io_cores": ["mid-hi"] * 3, "compute_cores": ["big", "mid"]}}),
    "powerinfer2 cpu prefill, no npu": (
        None, h.TINY_DENSE, "powerinfer2",
        {"offload": 0.6, "knobs": {"prefill_on_npu": False, "npu_activation_share": 0}}),
    "dense": (None, h.TINY_DENSE, "dense", {}),
    "llm-in-flash (32 parallel readers)": (None, h.TINY_MOE, "llm-in-flash", {"offload": 0.5}),
    "llamacpp (faulting compute threads)": (None, h.TINY_MOE, "llamacpp", {"offload": 0.5}),
}


def run(config: str):
    dev_kind, raw, strategy, kw = CONFIGS[config]
    dev = multi_queue_device() if dev_kind == "multi" else h.device()
    m = h.model(raw)
    return simulate(dev, m, strategy, trace=h.trace(m, 14), decode_tokens=10, prompt_tokens=8, warmup_tokens=4,
                    timeline=True, **kw)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_fast_paths_change_no_result(config, monkeypatch):
    fast = run(config)
    monkeypatch.setattr(Machine, "fast_paths", False)
    slow = run(config)
    pd.testing.assert_frame_equal(fast.tokens, slow.tokens, check_exact=True)
    assert h.summary_without_wall(fast.summary) == h.summary_without_wall(slow.summary)
    assert fast.spans == slow.spans


SERIAL_CONFIGS = {k: v for k, v in CONFIGS.items() if v[2] in ("llm-in-flash", "llamacpp")}
SERIAL_CONFIGS["llm-in-flash, no window"] = (None, h.TINY_DENSE, "llm-in-flash",
                                             {"offload": 0.7, "knobs": {"window_k": 0}})
SERIAL_CONFIGS["llm-in-flash, per-row move overhead"] = (None, h.TINY_MOE, "llm-in-flash",
                                                        {"offload": 0.5, "knobs": {"row_move_overhead_us": 2.0}})


@pytest.mark.parametrize("config", sorted(SERIAL_CONFIGS))
def test_closed_stretches_change_no_result(config, monkeypatch):
    """Sequential steps added on a local clock give what the per-step simpy events give."""
    _, raw, strategy, kw = SERIAL_CONFIGS[config]
    m = h.model(raw)

    def run_once():
        return simulate(h.device(), m, strategy, trace=h.trace(m, 14), decode_tokens=10, prompt_tokens=8,
                        warmup_tokens=4, **kw)

    closed = run_once()
    monkeypatch.setattr(Machine, "compiled_phases", False)  # no closed stretches: the reference
    reference = run_once()
    assert closed.summary["flash_bytes_per_token"] > 0
    pd.testing.assert_frame_equal(closed.tokens, reference.tokens, check_exact=True)
    assert h.summary_without_wall(closed.summary) == h.summary_without_wall(reference.summary)


# -- trace decoding ------------------------------------------------------------------------------

def reference_layer_work(chunk: TraceChunk, meta: TraceMeta, t: int, layer: int) -> LayerWork:
    """The per-layer decoding the engine used before: flat keys of each row, then a sort."""

    def flat(offsets, ids, r0, r1, experts):
        lengths = np.diff(offsets[r0:r1 + 1])
        base = np.repeat((layer * meta.n_experts + experts) * meta.n_neurons, lengths)
        return np.sort(ids[offsets[r0]:offsets[r1]].astype(np.int64) + base)

    experts = chunk.experts[t - chunk.start, layer].astype(np.int64)
    r0 = chunk.row(t, layer, 0)
    active = flat(chunk.offsets, chunk.ids, r0, r0 + meta.top_k, experts)
    predicted = active
    if chunk.pred_offsets is not None:
        predicted = flat(chunk.pred_offsets, chunk.pred_ids, r0, r0 + meta.top_k, experts)
    return LayerWork(layer, experts, active, predicted)


def hand_made_trace(predictions: bool) -> Trace:
    """Top-2 of 4 experts, deliberately listed in descending and ascending order."""
    meta = TraceMeta(model="hand", n_layers=2, n_neurons=10, hidden=8, n_experts=4, top_k=2, chunk_tokens=2)
    rng = np.random.default_rng(0)
    rows, preds = [], []
    experts = np.array([[[3, 1], [0, 2]], [[2, 0], [1, 3]], [[1, 2], [3, 0]]], dtype=np.int16)
    for _ in range(experts.size):
        rows.append(np.sort(rng.choice(10, rng.integers(0, 6), replace=False)).astype(np.int32))
        preds.append(np.sort(rng.choice(10, rng.integers(0, 6), replace=False)).astype(np.int32))
    return Trace.from_rows(meta, rows, experts, preds if predictions else None)


@pytest.mark.parametrize("source", ["hand, predicted", "hand, oracle", "synthetic moe", "synthetic dense"])
def test_vectorised_decoding_matches_per_layer_decoding(source):
    if source.startswith("hand"):
        tr = hand_made_trace(predictions=source.endswith("predicted"))
    else:
        tr = h.trace(h.model(h.TINY_MOE if source.endswith("moe") else h.TINY_DENSE), 20, seed=3)
    chunks = list(tr.chunks())
    got = list(iter_token_layers(tr, 1, tr.meta.n_tokens))
    assert [t for t, _ in got] == list(range(1, tr.meta.n_tokens))
    for t, layers in got:
        chunk = next(c for c in chunks if c.start <= t < c.start + c.n_tokens)
        for layer, work in enumerate(layers):
            ref = reference_layer_work(chunk, tr.meta, t, layer)
            assert work.layer == ref.layer
            np.testing.assert_array_equal(work.experts, ref.experts)
            np.testing.assert_array_equal(work.active, ref.active)
            np.testing.assert_array_equal(work.predicted, ref.predicted)
            assert work.active.dtype == np.int64
            assert (work.predicted is work.active) == (chunk.pred_offsets is None)


def reference_clusters(resident: np.ndarray, fired: np.ndarray, c: int) -> list[tuple[int, int, int, int]]:
    order = np.argsort(~resident, kind="stable")
    resident, fired = resident[order], fired[order]
    out = []
    for lo in range(0, resident.size, c):
        res, fir = resident[lo:lo + c], fired[lo:lo + c]
        miss = ~res
        out.append((int(res.size), int(fir.sum()), int(miss.sum()), int((miss & fir).sum())))
    return out


@settings(max_examples=60, deadline=None)
@given(bits=st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), max_size=300), cluster=st.integers(1, 64),
       cuts=st.lists(st.integers(0, 300), max_size=3))
def test_cluster_split_matches_the_loop(bits, cluster, cuts):
    """Per layer, a neuron is resident if hot or, if not, as the cache answered (its answer is
    the next of ``cold_hit``); the clusters are the loop's over the layer's neurons."""
    hot = np.array([b[0] for b in bits], dtype=bool)
    answer = np.array([b[1] for b in bits], dtype=bool)
    fired = np.array([b[2] for b in bits], dtype=bool)
    offsets = np.array(sorted({0, hot.size, *(min(c, hot.size) for c in cuts)}), dtype=np.int64)
    cold_offsets = np.array([np.count_nonzero(~hot[:o]) for o in offsets], dtype=np.int64)
    resident = hot | answer
    bounds, *arrays = split_clusters(hot, answer[~hot], fired, offsets, cold_offsets, cluster)
    got = list(zip(*(a.tolist() for a in arrays), strict=True))
    want = [c for lo, hi in itertools.pairwise(offsets)
            for c in reference_clusters(resident[lo:hi], fired[lo:hi], cluster)]
    assert bounds[-1] == len(got)
    assert got == want


@pytest.mark.parametrize("source", ["hand, predicted", "hand, oracle", "synthetic moe"])
def test_routing_from_chunk_rows_matches_routing_from_flat_arrays(source):
    """Planners read a token's keys straight from the chunk; the same as from gathered arrays."""
    tr = hand_made_trace(source.endswith("predicted")) if source.startswith("hand") else h.trace(
        h.model(h.TINY_MOE), 12, seed=4)
    n_keys = tr.meta.n_layers * tr.meta.n_experts * tr.meta.n_neurons
    rng = np.random.default_rng(1)
    is_npu, is_hot = rng.random(n_keys) < 0.3, rng.random(n_keys) < 0.4
    for _, work in iter_token_layers(tr, 0, tr.meta.n_tokens):
        flat = TokenWork.from_layers(list(work))
        for use_npu in (False, True):
            flags = placement_flags(is_hot, is_npu if use_npu else None)
            got = route_neurons(*work.key_rows(), flags, np.zeros(1, np.int64))
            want = route_neurons(*flat.key_rows(), flags, np.zeros(1, np.int64))
            assert got[0] == want[0]
            for g, w in zip(got[1:], want[1:], strict=True):
                np.testing.assert_array_equal(g, w)


@settings(max_examples=60, deadline=None)
@given(layers=st.lists(st.tuples(st.sets(st.integers(0, 99), max_size=60), st.sets(st.integers(0, 99), max_size=40),
                                 st.sets(st.integers(0, 99), max_size=20)),
                       min_size=1, max_size=4),
       npu_share=st.floats(0, 1), hot_share=st.floats(0, 1), use_npu=st.booleans())
def test_routing_matches_set_operations(layers, npu_share, hot_share, use_npu):
    """route_neurons against plain numpy: NPU keys dropped, fired = in the active set, cold = not hot;
    the predictor both misses active neurons and adds inactive ones."""
    rng = np.random.default_rng(len(layers))
    n_keys = 100 * len(layers)
    is_npu, is_hot = rng.random(n_keys) < npu_share, rng.random(n_keys) < hot_share
    works = []
    for i, (active, extra, missed) in enumerate(layers):
        act = np.array(sorted(active), dtype=np.int64) + 100 * i
        pred = np.array(sorted((active - missed) | extra), dtype=np.int64) + 100 * i
        works.append(LayerWork(i, np.zeros(1, dtype=np.int64), act, pred))
    tw = TokenWork.from_layers(works)
    flags = placement_flags(is_hot, is_npu if use_npu else None)
    before = flags.copy()
    epoch = np.array([MAX_EPOCH - 2])  # the marks wrap around within the calls below
    for call in range(4):  # each call's active set, never an earlier call's marks
        if call % 2:
            tw = TokenWork.from_layers([LayerWork(w.layer, w.experts, w.active[:0], w.predicted) for w in works])
        else:
            tw = TokenWork.from_layers(works)
        n_predicted, offsets, fired, hot, cold, cold_offsets = route_neurons(*tw.key_rows(), flags, epoch)
        assert n_predicted == tw.predicted.size
        np.testing.assert_array_equal(flags & PLACEMENT, before)  # the placement is left as it was
        for i, w in enumerate(tw):
            want = w.predicted[~is_npu[w.predicted]] if use_npu else w.predicted
            assert offsets[i + 1] - offsets[i] == want.size
            np.testing.assert_array_equal(fired[offsets[i]:offsets[i + 1]], np.isin(want, w.active))
            np.testing.assert_array_equal(hot[offsets[i]:offsets[i + 1]], is_hot[want])
            np.testing.assert_array_equal(cold[cold_offsets[i]:cold_offsets[i + 1]], want[~is_hot[want]])


# -- replaying a lazy trace --------------------------------------------------------------------

class CountingTrace(Trace):
    def __init__(self, source: Trace):
        super().__init__(source.meta, None)
        self.source, self.passes, self.read = source, 0, 0

    def chunks(self):
        self.passes += 1
        for chunk in self.source.chunks():
            self.read += 1
            yield chunk


def test_replayed_lazy_trace_gives_the_materialised_result():
    m = h.model()
    lazy = synth_trace(h.params(), SynthDims.from_model(m), 14, seed=5, chunk_tokens=4)
    kw = {"decode_tokens": 10, "prompt_tokens": 8, "warmup_tokens": 4, "offload": 0.5}
    a = simulate(h.device(), m, "powerinfer2", trace=lazy, **kw)
    b = simulate(h.device(), m, "powerinfer2", trace=lazy.materialise(), **kw)
    pd.testing.assert_frame_equal(a.tokens, b.tokens, check_exact=True)


@pytest.mark.parametrize("limit", [0, 10**9])
def test_replay_reads_the_source_once_when_it_fits(limit):
    source = CountingTrace(h.trace(h.model(), 14))
    replay = ReplayTrace(source, limit_bytes=limit)
    first = popularity(replay, 0, 14)
    tokens = [t for t, _ in iter_token_layers(replay, 0, 14)]
    np.testing.assert_array_equal(first, popularity(source.source, 0, 14))
    assert tokens == list(range(14))
    assert source.passes == (1 if limit else 2)


@pytest.mark.parametrize("limit", [0, 10**9])
def test_a_pass_that_stops_early_is_resumed_not_repeated(limit):
    """The profile reads only the first tokens; the run's pass must not generate them again."""
    lazy = synth_trace(h.params(), SynthDims.from_model(h.model()), 14, seed=5, chunk_tokens=4)
    source = CountingTrace(lazy)
    replay = ReplayTrace(source, limit_bytes=limit)
    profile = popularity(replay, 0, 4)  # one chunk, then the pass stops
    inner = iter_token_layers(replay, 0, 14)
    first = [next(inner)[0] for _ in range(6)]
    nested = [t for t, _ in iter_token_layers(replay, 0, 14)]  # a second pass while the first is open
    rest = [t for t, _ in inner]
    np.testing.assert_array_equal(profile, popularity(lazy.materialise(), 0, 4))
    assert first + rest == nested == list(range(14))
    n_chunks = 4
    if limit:
        assert source.read == n_chunks and source.passes == 1
    else:  # nothing kept: each of the three passes reads the source itself
        assert source.passes == 3


def test_split_clusters_of_a_token_match_the_per_layer_loop():
    rng = np.random.default_rng(3)
    sizes = [0, 1, 7, 16, 33, 100]
    resident = rng.random(sum(sizes)) < 0.6
    hot = resident & (rng.random(resident.size) < 0.5)  # the rest resident as the cache answered
    fired = rng.random(sum(sizes)) < 0.5
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    cold_offsets = np.array([np.count_nonzero(~hot[:o]) for o in offsets], dtype=np.int64)
    for cluster in (1, 4, 16, 512):
        bounds, *arrays = split_clusters(hot, resident[~hot], fired, offsets, cold_offsets, cluster)
        for layer in range(len(sizes)):
            lo, hi = offsets[layer], offsets[layer + 1]
            want = reference_clusters(resident[lo:hi], fired[lo:hi], cluster)
            got = list(zip(*(a[bounds[layer]:bounds[layer + 1]].tolist() for a in arrays), strict=True))
            assert got == want


# -- the compiled FFN phase ---------------------------------------------------------------------

COMPILED_CONFIGS = {
    "default split, 50% offloaded": (h.TINY_MOE, {"offload": 0.5}),
    "heavy misses, small clusters queue for the I/O thread and the cores": (
        h.TINY_MOE, {"offload": 0.9, "knobs": {"cluster_neurons": 8}}),
    "no NPU, dense model, big and mid cores": (
        h.TINY_DENSE, {"offload": 0.6, "knobs": {"npu_activation_share": 0, "compute_cores": ["big", "mid"]}}),
    "one read per neuron (no gate split), all in DRAM": (
        h.TINY_MOE, {"offload": 0.0, "knobs": {"split_gate_read": False, "cluster_neurons": 4}}),
    "no gate split, offloaded": (h.TINY_DENSE, {"offload": 0.7, "knobs": {"split_gate_read": False}}),
    "hot share on the GPU": (h.TINY_MOE, {"offload": 0.5, "knobs": {"hot_unit": "gpu"}}),
    # [PI2] §7.5's ablation knobs the compiled phase covers (without the pipeline the processes run)
    "rows read apart, a static resident set, the CPU alone": (
        h.TINY_MOE, {"offload": 0.7, "knobs": {"bundle": False, "neuron_cache": False, "xpu": False}}),
    "rows read apart, fp16": (h.TINY_DENSE, {"offload": 0.6, "weights_dtype": "fp16", "knobs": {"bundle": False}}),
}


@pytest.mark.parametrize("config", sorted(COMPILED_CONFIGS))
def test_compiled_ffn_phase_matches_per_cluster_processes(config, monkeypatch):
    """One compiled call per layer gives the schedule of the per-cluster simpy processes."""
    raw, kw = COMPILED_CONFIGS[config]
    m = h.model(raw)

    def run_once():
        return simulate(h.device(), m, "powerinfer2", trace=h.trace(m, 24), decode_tokens=16, prompt_tokens=8,
                        warmup_tokens=4, **kw)

    compiled = run_once()
    monkeypatch.setattr(Machine, "compiled_phases", False)
    reference = run_once()
    assert compiled.summary["flash_bytes_per_token"] > 0 or kw["offload"] == 0.0
    # The clock lands on the same instants: per-token latency is bit-identical. Busy times
    # are summed in another order (per phase rather than per job): equal to rounding.
    np.testing.assert_array_equal(compiled.tokens["latency_s"], reference.tokens["latency_s"])
    pd.testing.assert_frame_equal(compiled.tokens, reference.tokens, check_exact=False, rtol=1e-9, atol=1e-15)
    a, b = h.summary_without_wall(compiled.summary), h.summary_without_wall(reference.summary)
    assert a.keys() == b.keys()
    for key in a:
        if key in ("bottleneck", "steady_state"):  # nested: the same names, shares equal to rounding
            _assert_close(a[key], b[key], key)
        elif isinstance(a[key], float | dict):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-15), key
        else:
            assert a[key] == b[key], key


def _assert_close(a, b, where: str) -> None:
    """Nested mappings equal in keys and text, their floats equal to rounding."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15, nan_ok=True), where
    else:
        assert a == b, where


@pytest.mark.parametrize(("start", "stop"), [(0, 14), (3, 11), (13, 14)])
def test_popularity_counts_every_active_key_of_the_tokens(start, stop):
    """The compiled count against a bincount of the decoded per-layer active keys."""
    trace = synth_trace(h.params(), SynthDims.from_model(h.model(h.TINY_MOE)), 14, seed=2, chunk_tokens=4)
    meta = trace.meta
    keys = [w.active for _, layers in iter_token_layers(trace, start, stop) for w in layers]
    want = np.bincount(np.concatenate(keys), minlength=meta.n_layers * meta.n_experts * meta.n_neurons)
    np.testing.assert_array_equal(popularity(trace, start, stop), want)


# -- the NPU's hot set ---------------------------------------------------------------------------

def reference_top_share(per: np.ndarray, share: float) -> np.ndarray:
    """The sort-based selection the strategy used before the counting sort."""
    order = np.argsort(-per, axis=1, kind="stable")
    counts = np.take_along_axis(per, order, axis=1)
    before = np.cumsum(counts, axis=1) - counts
    take = (before < share * np.maximum(counts.sum(axis=1, keepdims=True), 1)) & (counts > 0)
    out = np.zeros_like(per, dtype=bool)
    np.put_along_axis(out, order, take, axis=1)
    return out


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 5), n=st.integers(1, 60), top=st.integers(0, 12), share=st.floats(0, 1),
       seed=st.integers(0, 99))
def test_npu_share_selection_matches_the_sort(rows, n, top, share, seed):
    per = np.random.default_rng(seed).integers(0, top + 1, size=(rows, n)).astype(np.int64)
    np.testing.assert_array_equal(top_share(per, share), reference_top_share(per, share))


# -- reading a lazy trace ahead -----------------------------------------------------------------

class FailingTrace(Trace):
    """Yields its source's first chunk, then fails as a corrupt file would."""

    def __init__(self, source: Trace):
        super().__init__(source.meta, None)
        self.source = source

    def chunks(self):
        for i, chunk in enumerate(self.source.chunks()):
            if i == 1:
                raise SimError("chunk 1 is corrupt", source="trace.parquet", field="ids")
            yield chunk


def test_read_ahead_gives_the_same_tokens_and_profile():
    lazy = synth_trace(h.params(), SynthDims.from_model(h.model()), 14, seed=5, chunk_tokens=3)
    ahead = ReplayTrace(lazy, read_ahead=2)
    plain = lazy.materialise()
    np.testing.assert_array_equal(popularity(ahead, 0, 5), popularity(plain, 0, 5))
    got = [(t, w.predicted.tolist()) for t, w in iter_token_layers(ahead, 2, 14)]
    want = [(t, w.predicted.tolist()) for t, w in iter_token_layers(plain, 2, 14)]
    assert got == want


def test_read_ahead_hands_a_source_error_to_the_pass():
    source = FailingTrace(synth_trace(h.params(), SynthDims.from_model(h.model()), 14, seed=5, chunk_tokens=4))
    ahead = ReplayTrace(source, read_ahead=2)
    with pytest.raises(SimError, match="chunk 1 is corrupt"):
        list(iter_token_layers(ahead, 0, 14))


def test_read_ahead_thread_ends_when_the_trace_is_dropped():
    import gc
    import threading
    import time

    lazy = synth_trace(h.params(), SynthDims.from_model(h.model()), 40, seed=5, chunk_tokens=2)
    before = set(threading.enumerate())
    ahead = ReplayTrace(lazy, read_ahead=1)
    [reader] = [t for t in threading.enumerate() if t not in before and t.name == "trace-read-ahead"]
    next(iter_token_layers(ahead, 0, 40))  # the reader now waits for passes to catch up
    time.sleep(0.1)
    assert reader.is_alive()
    del ahead
    gc.collect()
    reader.join(timeout=5)
    assert not reader.is_alive()


@settings(max_examples=80, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=200), n=st.integers(0, 210),
       excluded=st.lists(st.booleans(), min_size=200, max_size=200), use_exclude=st.booleans(), ints=st.booleans(),
       big=st.booleans())
def test_the_hot_set_and_preload_order_are_the_top_counted_keys(counts, n, excluded, use_exclude, ints, big):
    """The neuron cache's selection: the n most counted keys outside the excluded ones, least
    counted first, ties by key, from activation counts (counting sort) or any other profile."""
    from sim.engine.neuron_cache import _top

    c = np.array(counts, dtype=np.int64 if ints else np.float64)
    if ints and big:  # counts too large for a histogram take the sort
        c *= 1 << 40
    exclude = np.array(excluded[:c.size]) if use_exclude else None
    keys = np.arange(c.size) if exclude is None else np.flatnonzero(~exclude)
    want = keys[np.lexsort((keys, -c[keys]))][:n]
    want = want[np.lexsort((want, c[want]))]
    np.testing.assert_array_equal(_top(c, n, exclude), want)
