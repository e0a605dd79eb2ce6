"""sim/plots.py: the derived latency breakdown and what each figure draws from its DataFrame.

Runs use the engine tests' tiny models (milliseconds each). Figure tests read back the
artists matplotlib holds (line data, bar heights, cell values), so they check the numbers a
reader sees, not only that a file appeared.
"""

from __future__ import annotations

import engine_helpers as h
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.collections import PathCollection

from sim.engine.simulation import simulate
from sim.errors import SimError
from sim.plots import (
    BREAKDOWN_PARTS,
    latency_breakdown,
    plot_ablation,
    plot_gantt,
    plot_latency_breakdown,
    plot_published_vs_predicted,
    plot_sweep_heatmap,
    plot_tokens_vs_budget,
    plot_validation_errors,
    save_figure,
    spans_frame,
    write_validation_plots,
)

PARTS_MS = [f"{p}_ms" for p in BREAKDOWN_PARTS]
PNG = b"\x89PNG\r\n\x1a\n"


def _run(strategy: str, device=None, mode: str = "des", timeline: bool = False, **kw):
    m = h.model()
    if strategy != "dense":
        kw.setdefault("offload", 0.5)
    return simulate(device or h.device(), m, strategy, trace=h.trace(m, 24), decode_tokens=6, warmup_tokens=4,
                    mode=mode, timeline=timeline, **kw)


# -- latency_breakdown ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["des", "analytic"])
@pytest.mark.parametrize("strategy", ["powerinfer2", "llm-in-flash", "llamacpp", "dense"])
def test_breakdown_parts_are_non_negative_and_sum_to_latency(strategy, mode):
    tokens = _run(strategy, mode=mode).tokens
    b = latency_breakdown(tokens, label="x")
    assert (b[PARTS_MS] >= -1e-12).all().all()
    np.testing.assert_allclose(b[PARTS_MS].sum(axis=1), tokens["latency_s"] * 1e3, rtol=1e-9, atol=1e-9)
    assert (b["label"] == "x").all() and list(b["token"]) == list(tokens["token"])


def test_serial_strategies_stall_for_exactly_their_io_phase():
    tokens = _run("llm-in-flash").tokens
    b = latency_breakdown(tokens)
    np.testing.assert_allclose(b["io_stall_ms"], tokens["io_s"] * 1e3)
    np.testing.assert_allclose(b["ffn_compute_ms"], tokens["ffn_s"] * 1e3)


def test_everything_in_dram_has_no_io_stall():
    assert latency_breakdown(_run("dense").tokens)["io_stall_ms"].abs().max() < 1e-9


def test_overlapped_ffn_stalls_longer_on_slower_flash_and_computes_the_same():
    fast = latency_breakdown(_run("powerinfer2", h.scaled_storage(4.0)).tokens).mean(numeric_only=True)
    slow = latency_breakdown(_run("powerinfer2", h.scaled_storage(0.05)).tokens).mean(numeric_only=True)
    assert slow["io_stall_ms"] > 2 * fast["io_stall_ms"]
    assert slow["ffn_compute_ms"] == pytest.approx(fast["ffn_compute_ms"], rel=0.25)


@settings(max_examples=40, deadline=None)
@given(ffn=st.floats(0.0, 5.0), cpu=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=4),
       npu=st.floats(0.0, 5.0), attn=st.floats(0.0, 1.0))
def test_overlapped_split_is_the_busiest_engine_capped_by_the_phase(ffn, cpu, npu, attn):
    row = {"token": 0, "attention_s": attn, "ffn_s": ffn, "latency_s": attn + ffn, "busy_npu_s": npu}
    row.update({f"busy_cpu:c{i}_s": attn + c for i, c in enumerate(cpu)})
    b = latency_breakdown(pd.DataFrame([row])).iloc[0]
    compute = min(max(float(np.mean(cpu)), npu), ffn)
    assert b["ffn_compute_ms"] == pytest.approx(compute * 1e3, abs=1e-9)
    assert b["io_stall_ms"] == pytest.approx((ffn - compute) * 1e3, abs=1e-9)
    assert b[PARTS_MS].sum() == pytest.approx(b["latency_ms"], abs=1e-9)


# -- figures ----------------------------------------------------------------------------------


def test_tokens_vs_budget_draws_each_strategy_sorted_and_published_points():
    runs = pd.DataFrame({"strategy": ["a", "a", "a", "b", "b"], "memory_budget_bytes": [3e9, 1e9, 2e9, 1e9, 2e9],
                         "decode_tokens_per_s": [3.0, 1.0, 2.0, 0.5, np.nan], "model": "m", "device": "d"})
    published = pd.DataFrame({"strategy": ["a"], "budget_bytes": [2.5e9], "published": [2.2], "source": ["[X] T1"]})
    ax = plot_tokens_vs_budget(runs, published, caption="from a test")
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    np.testing.assert_allclose(lines["a (simulated)"].get_xdata(), [1e9, 2e9, 3e9])
    np.testing.assert_allclose(lines["a (simulated)"].get_ydata(), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(lines["b (simulated)"].get_ydata(), [0.5])  # NaN run left out
    [points] = ax.collections
    np.testing.assert_allclose(points.get_offsets(), [[2.5e9, 2.2]])
    assert "[X] T1" in points.get_label()
    assert "from a test" in [t.get_text() for t in ax.figure.texts]
    assert "2.2" in [t.get_text() for t in ax.texts]
    assert ax.get_xlabel() and ax.get_ylabel() == "decode speed (tokens/s)"


def test_breakdown_bars_stack_to_the_mean_latency_per_label():
    a = latency_breakdown(_run("llm-in-flash").tokens, label="flash")
    b = latency_breakdown(_run("powerinfer2").tokens, label="pi2")
    ax = plot_latency_breakdown(pd.concat([a, b]))
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert tops[0] == pytest.approx(a["latency_ms"].mean()) and tops[1] == pytest.approx(b["latency_ms"].mean())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["flash", "pi2"]
    with pytest.raises(SimError, match="ffn_compute_ms"):
        plot_latency_breakdown(a.drop(columns="ffn_compute_ms"))


def test_gantt_has_a_row_per_unit_and_only_the_chosen_token():
    spans = _run("powerinfer2", timeline=True).spans
    df = spans_frame(spans)
    ax = plot_gantt(spans, first_token=1, n_tokens=1)
    units = [t.get_text() for t in ax.get_yticklabels()]
    assert sorted(units) == sorted(df.loc[df["token"] == 1, "unit"].unique())
    assert units[-1] == "storage" and units[0].startswith("cpu")
    n_bars = sum(len(c.get_paths()) for c in ax.collections)
    assert n_bars == int((df["token"] == 1).sum())
    starts = np.concatenate([c.get_paths()[0].vertices[:, 0] for c in ax.collections])
    assert starts.min() == pytest.approx(0.0, abs=1e-9)


def test_heatmap_orders_sizes_by_value_and_averages_cells():
    df = pd.DataFrame({"budget": ["12GB", "8GB", "16GB", "8GB", "8GB"], "cores": [4, 4, 4, 2, 4],
                       "tps": [3.0, 1.0, 5.0, 0.5, 2.0], "status": ["ok", "ok", "ok", "ok", "failed"]})
    ax = plot_sweep_heatmap(df, "budget", "cores", "tps")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8GB", "12GB", "16GB"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["2", "4"]
    grid = np.asarray(ax.images[0].get_array(), dtype=float)
    np.testing.assert_allclose(grid[1], [1.0, 3.0, 5.0])  # the failed row (2.0) is left out
    assert grid[0, 0] == 0.5 and np.isnan(grid[0, 1:]).all()
    with pytest.raises(SimError, match="nope"):
        plot_sweep_heatmap(df, "budget", "cores", "nope")


def _validation_frame() -> pd.DataFrame:
    return pd.DataFrame({"id": ["p1", "p2", "p3"], "source": ["[PI2] Fig. 10", "[FLASH] Table 2", "[PI2] T6"],
                         "metric": ["decode_tokens_per_s", "phase_ms.io", "decode_tokens_per_s"],
                         "published": [2.0, 100.0, 3.0], "predicted": [2.1, 60.0, np.nan],
                         "error_pct": [5.0, -40.0, np.nan], "tolerance_pct": [15.0, 15.0, 15.0]})


def test_validation_figures_show_each_point_and_name_failures(tmp_path):
    df = _validation_frame()
    ax = plot_validation_errors(df)
    bars = [p for p in ax.patches if p.get_height() > 0]
    np.testing.assert_allclose([b.get_width() for b in bars], [5.0, -40.0, 0.0])
    assert "failed" in [t.get_text() for t in ax.texts]
    ax = plot_published_vs_predicted(df)
    offsets = np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
    assert {tuple(o) for o in offsets} >= {(2.0, 2.1), (100.0, 60.0)} and len(offsets) == 2
    assert any("p3" in t.get_text() for t in ax.figure.texts)
    paths = write_validation_plots(df, tmp_path / "v")
    assert [p.name for p in paths] == ["validation_errors.png", "published_vs_predicted.png"]
    assert all(p.read_bytes()[:8] == PNG for p in paths)


def test_ablation_bars_are_each_rungs_speed_labelled_with_its_step():
    df = pd.DataFrame({"rung": ["baseline", "+bundle", "+pipeline"], "decode_tokens_per_s": [2.0, 3.0, 2.7],
                       "speedup": [np.nan, 1.5, 0.9]})
    ax = plot_ablation(df, caption="test")
    assert [p.get_height() for p in ax.patches] == [2.0, 3.0, 2.7]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["baseline", "+bundle", "+pipeline"]
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["2", "3\n1.50x", "2.7\n0.90x"]
    with pytest.raises(SimError, match="speedup"):
        plot_ablation(df.drop(columns="speedup"))


def test_save_figure_rejects_unknown_formats(tmp_path):
    ax = plot_validation_errors(_validation_frame())
    with pytest.raises(SimError, match=r"\.png, \.pdf or \.svg"):
        save_figure(ax.figure, tmp_path / "x.jpg")
