"""PowerInfer-2's mechanisms switched off one at a time (the knobs of [PI2] §7.5's ablation).

Each knob changes what its description says and nothing else: ``bundle`` the count and
size of the flash requests, ``neuron_cache`` whether anything but a static set stays in
DRAM, ``pipeline`` whether reads overlap compute in the timeline, ``xpu`` whether the
accelerator works at all. Runs are tiny (engine_helpers); assertions compare runs with each
other or with the bundle's byte sizes, never with fixed figures.
"""

from __future__ import annotations

from dataclasses import replace

import engine_helpers as h
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.neuron_cache import NeuronCache
from sim.engine.simulation import simulate
from sim.errors import SimError
from sim.traces.format import Trace


def run(knobs: dict, raw=h.TINY_DENSE, *, decode_tokens: int = 10, warmup_tokens: int = 4, timeline: bool = False,
        **kw):
    m = h.model(raw, **kw.pop("model_changes", {}))
    return simulate(h.device(), m, "powerinfer2", trace=h.trace(m, 24), decode_tokens=decode_tokens,
                    prompt_tokens=8, warmup_tokens=warmup_tokens, knobs=knobs, timeline=timeline,
                    **{"offload": 0.7, **kw})


@pytest.mark.parametrize(("dtype", "hidden"), [("int4", 256), ("int4", 4096), ("fp16", 2048)])
def test_unbundled_rows_are_one_request_each_of_one_rows_pages(dtype, hidden):
    """Bundled: a missing neuron's Gate read, then one read of Up and Down together (the whole
    bundle at once when it fits a page); unbundled: Gate, Up and Down one request each, of one
    row's pages. The cache sees the same requests either way."""
    changes = {"model_changes": {"hidden": hidden}, "weights_dtype": dtype}
    bundled, unbundled = run({}, **changes), run({"bundle": False}, **changes)
    np.testing.assert_array_equal(bundled.tokens["misses"], unbundled.tokens["misses"])
    bundle = h.model(h.TINY_DENSE, hidden=hidden).bundle(dtype, h.device().storage.page_bytes)
    gate_misses = int(bundled.tokens["misses"].sum())  # each missing neuron's Gate is read once
    assert gate_misses > 0
    # the prefill's prefetch reads are the same in both runs: the difference is decode's Up/Down rows
    extra = unbundled.usage.flash_requests - bundled.usage.flash_requests
    bundled_bytes, unbundled_bytes = bundled.tokens["flash_bytes"].sum(), unbundled.tokens["flash_bytes"].sum()
    if bundle.up_down_flash_bytes:  # Gate, then Up/Down of the missing neurons that fired: one request more
        fired = (bundled_bytes - gate_misses * bundle.gate_flash_bytes) // bundle.up_down_flash_bytes
        assert extra == fired
    else:  # the whole bundle fits one page: one request, where rows apart are Gate, then Up and Down if fired
        assert bundled_bytes == gate_misses * bundle.flash_bytes
        fired, odd = divmod(extra, 2)
        assert not odd
    assert 0 < fired <= gate_misses
    assert unbundled_bytes == (gate_misses + 2 * fired) * bundle.row_flash_bytes
    assert unbundled.summary["latency_ms_mean"] >= bundled.summary["latency_ms_mean"]


def each_token_twice(trace: Trace) -> Trace:
    """``trace`` with every token repeated right after itself."""
    meta, active, predicted = trace.meta, [], []
    for chunk in trace.chunks():
        for t in range(chunk.start, chunk.start + chunk.n_tokens):
            rows = range(chunk.row(t, 0), chunk.row(t, meta.n_layers - 1) + 1)
            token = [chunk.ids[chunk.offsets[r]:chunk.offsets[r + 1]] for r in rows]
            guess = [chunk.pred_ids[chunk.pred_offsets[r]:chunk.pred_offsets[r + 1]] for r in rows]
            active += token * 2
            predicted += guess * 2
    return Trace.from_rows(replace(meta, n_tokens=2 * meta.n_tokens), active, None, predicted)


def test_without_the_neuron_cache_nothing_read_is_kept_for_the_next_token():
    """Each token twice in a row: the dynamic cache keeps what the first read, so the repeat
    misses less; the static set is the same for both, so the repeat misses as much."""
    m = h.model(h.TINY_DENSE)
    trace = each_token_twice(h.trace(m, 12))

    def misses(knobs: dict) -> np.ndarray:
        result = simulate(h.device(), m, "powerinfer2", trace=trace, decode_tokens=16, prompt_tokens=8,
                          warmup_tokens=0, profile_tokens=4, offload=0.7, knobs=knobs)
        return result.tokens["misses"].to_numpy().reshape(-1, 2)  # (first, repeat) per token

    static, dynamic = misses({"neuron_cache": False}), misses({})
    assert static[:, 0].sum() > 0
    np.testing.assert_array_equal(static[:, 0], static[:, 1])
    assert (dynamic[:, 1] < dynamic[:, 0]).all()


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=60), fit=st.integers(0, 70),
       requests=st.lists(st.integers(0, 59), max_size=40))
def test_a_static_cache_pins_the_budgets_most_popular_and_keeps_nothing_else(counts, fit, requests):
    popularity = np.array(counts, dtype=np.int64)
    n = popularity.size
    cache = NeuronCache(n, 8, fit * 8, popularity, 0.5, "lru", static=True)
    pinned = min(fit, n)
    assert int(cache.is_hot.sum()) == pinned and cache.cold_capacity == 0
    if 0 < pinned < n:  # the pinned ones are the most popular
        assert popularity[cache.is_hot].min() >= popularity[~cache.is_hot].max()
    cold = np.array([k for k in requests if k < n and not cache.is_hot[k]], dtype=np.int64)
    hits = cache.cold_hits(np.concatenate([cold, cold]), np.array([0, cold.size, 2 * cold.size]), 0)
    assert not hits.any()  # asked twice, never kept


def _overlap_s(spans, a, b) -> float:
    """Seconds during which a decode span of units ``a`` and one of units ``b`` both run."""
    total = 0.0
    for x in (s for s in spans if s.token >= 0 and a(s.unit)):
        for y in (s for s in spans if s.token >= 0 and b(s.unit)):
            total += max(0.0, min(x.end_s, y.end_s) - max(x.start_s, y.start_s))
    return total


def _is_compute(unit: str) -> bool:
    return unit.startswith("cpu:") or unit in ("npu", "gpu")


def test_without_the_pipeline_no_read_overlaps_any_compute_in_the_timeline():
    pipelined = run({}, raw=h.TINY_MOE, offload=0.9, timeline=True)
    staged = run({"pipeline": False}, raw=h.TINY_MOE, offload=0.9, timeline=True)
    reads = "storage".__eq__
    assert _overlap_s(pipelined.spans, reads, _is_compute) > 0  # the pipeline hides reads behind compute
    assert any(s.unit == "storage" and s.token >= 0 for s in staged.spans)
    assert _overlap_s(staged.spans, reads, _is_compute) == 0.0
    np.testing.assert_array_equal(pipelined.tokens["flash_bytes"], staged.tokens["flash_bytes"])
    assert staged.summary["latency_ms_mean"] > pipelined.summary["latency_ms_mean"]


def test_without_the_pipeline_the_cost_model_adds_reads_to_compute():
    both = [run(knobs, raw=h.TINY_MOE, offload=0.9, mode="analytic") for knobs in ({}, {"pipeline": False})]
    assert both[1].summary["latency_ms_mean"] > both[0].summary["latency_ms_mean"]


def test_without_xpu_the_npu_is_never_busy():
    with_xpu, cpu_only = run({}, raw=h.TINY_MOE), run({"xpu": False}, raw=h.TINY_MOE)
    for phase in ("utilisation", "prefill_utilisation"):
        assert with_xpu.summary[phase].get("npu", 0) > 0
        assert cpu_only.summary[phase].get("npu", 0) == 0
    assert "npu" not in cpu_only.usage.busy_s or cpu_only.usage.busy_s["npu"] == 0
    np.testing.assert_array_equal(with_xpu.tokens["misses"], cpu_only.tokens["misses"])


@pytest.mark.parametrize("knobs", [{"xpu": False, "hot_unit": "npu"}, {"xpu": False, "prefill_unit": "gpu"}])
def test_xpu_off_refuses_a_knob_that_names_an_accelerator(knobs):
    with pytest.raises(SimError, match=r"xpu: false runs everything on the CPU, which contradicts (hot|prefill)_unit"):
        run(knobs)
