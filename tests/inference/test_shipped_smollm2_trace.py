"""The SmolLM2 decode trace shipped under traces/: its .md's figures are recomputed from the file."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from sim.inference.decode_trace import quality_markdown
from sim.traces.format import Trace
from sim.traces.stats import trace_stats

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "smollm2-135m-decode.npz"
NOTE = ROOT / "traces" / "smollm2-135m-decode.md"


def _row(md: str, label: str) -> list[float]:
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {label}"))
    cell = line.split("|")[2]
    return [float(x) for x in re.findall(r"(?<![\w-])\d+\.\d+", cell)]


def test_shipped_decode_trace_is_small_real_and_a_decode():
    assert TRACE.stat().st_size < 4 * 1024 * 1024
    m = Trace.load(TRACE).meta
    assert (m.model, m.source, m.n_layers, m.n_neurons, m.hidden) == ("smollm2-135m", "recorded", 30, 1536, 576)
    assert m.extra["weights"] == "real checkpoint" and m.has_predictions
    assert 0 < m.prompt_tokens < m.n_tokens and m.extra["mode"].startswith("decoder: prefill")


def test_md_figures_are_the_files():
    trace = Trace.load(TRACE)
    s = trace_stats(trace)
    md = NOTE.read_text(encoding="utf-8")
    dens = _row(md, "density per layer")
    np.testing.assert_allclose(dens[:-1], s["density"], atol=5e-4)
    np.testing.assert_allclose(dens[-1], s["density_mean"], atol=5e-4)
    pop = _row(md, "share of activations covered")
    np.testing.assert_allclose(pop, [s["popularity"][k] for k in (1, 5, 10, 20, 50)], atol=5e-4)
    win = _row(md, "share of the FFN newly needed")
    np.testing.assert_allclose(win, [s["window_new_share"][k] for k in range(11)], atol=5e-4)
    assert win == sorted(win, reverse=True)  # a longer window never needs more
    np.testing.assert_allclose(_row(md, "share of a token's active neurons"), [s["overlap"]], atol=5e-4)
    reuse = _row(md, "reuse distance")
    np.testing.assert_allclose(reuse, s["reuse_distance"]["share"], atol=5e-4)
    # the recorded density is what the decode realised, layer by layer
    np.testing.assert_allclose(trace.meta.extra["density_per_layer"], s["density"], atol=1e-6)


def test_quality_table_is_the_metadata_and_costs_grow_as_density_falls():
    m = Trace.load(TRACE).meta
    q = m.extra["quality"]
    md = NOTE.read_text(encoding="utf-8")
    assert quality_markdown(q, q[0]["eval_tokens"], q[0]["steps"], len(q[0]["prompts"])) in md
    assert [r["target_density"] for r in q] == [1.0, 0.5, 0.3, 0.15]
    assert q[0]["density"] == 1.0 and q[0]["greedy_agreement"] == 1.0
    ppl = [r["perplexity"] for r in q]
    assert ppl == sorted(ppl)
    for r in q[1:]:
        assert abs(r["density"] - r["target_density"]) < 0.05  # thresholds from other text still hit the target


def test_quality_table_dense_row_is_recomputed(smollm2):
    """The 100% row's perplexity, recomputed from the model on the same tokens."""
    q = Trace.load(TRACE).meta.extra["quality"][0]
    ids = smollm2.tok.encode((ROOT / "traces" / "corpus" / q["eval_text"]).read_text(encoding="utf-8"))
    ppl = smollm2.perplexity(ids[-q["eval_tokens"] - 1:])
    assert abs(ppl - q["perplexity"]) < 1e-2 * q["perplexity"]
