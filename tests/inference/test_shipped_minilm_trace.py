"""The real MiniLM trace shipped under traces/."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from sim.inference.recorder import record_trace
from sim.traces.format import Trace

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "traces" / "corpus" / "pride_and_prejudice_ch1.txt"
SHIPPED_TRACE = ROOT / "traces" / "minilm-l6-v2.npz"


def test_shipped_trace_is_real_and_valid():
    assert SHIPPED_TRACE.stat().st_size < 2 * 1024 * 1024
    trace = Trace.load(SHIPPED_TRACE)
    m = trace.meta
    assert (m.source, m.model) == ("recorded", "all-minilm-l6-v2")
    assert (m.n_layers, m.n_neurons, m.hidden) == (6, 1536, 384)
    assert m.extra["weights"] == "real checkpoint"
    assert 200 <= m.n_tokens <= 1000 and m.has_predictions
    assert m.activation_threshold is not None and m.activation_threshold > 0
    assert len(m.predictor["recall"]) == 6 and m.predictor["size_bytes"] > 0
    counts = np.concatenate([c.counts().ravel() for c in trace.chunks()])  # validates every chunk
    density = counts.mean() / m.n_neurons
    assert 0.02 < density < 0.5  # sparse, but not empty


def test_shipped_trace_is_reproduced_from_the_checkpoint(minilm, tmp_path):
    shipped = Trace.load(SHIPPED_TRACE)
    assert shipped.meta.extra["text_sha256"] == hashlib.sha256(CORPUS.read_text("utf-8").encode()).hexdigest()
    again = Trace.load(record_trace("all-minilm-l6-v2", CORPUS, 64, tmp_path / "t.npz", predictor="none"))
    a, b = next(shipped.chunks()), next(again.chunks())
    same = sum(np.intersect1d(a.active(t, layer), b.active(t, layer)).size for t in range(64) for layer in range(6))
    total = sum(np.union1d(a.active(t, layer), b.active(t, layer)).size for t in range(64) for layer in range(6))
    assert same / total > 0.999
