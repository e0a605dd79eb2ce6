"""sim/kernel_warmup.py: the engine's kernels compiled beside a first run's trace."""

from __future__ import annotations

import json

import engine_helpers as h
import numpy as np

from sim import kernel_warmup
from sim.engine.simulation import simulate
from sim.engine.workload import popularity
from sim.traces.format import check_chunk


def test_the_tiny_trace_has_the_models_shape_and_predictions():
    model = h.model()
    trace = kernel_warmup.tiny_trace(model, n_tokens=4)
    assert (trace.meta.n_layers, trace.meta.n_neurons, trace.meta.n_experts, trace.meta.top_k) == (
        model.n_layers, model.ffn_dim, model.n_experts, model.top_k)
    assert trace.meta.n_tokens == 4 and trace.meta.has_predictions
    for chunk in trace.chunks():
        check_chunk(chunk, trace.meta)
    assert popularity(trace, 0, 4).sum() > 0


def test_the_helper_runs_the_configuration_on_the_tiny_trace(capsys):
    model = h.model()
    spec = {"device": h.device().model_dump(mode="json"), "model": model.model_dump(mode="json"),
            "strategy": "powerinfer2", "knobs": {}, "policy": None, "mode": "des", "weights_dtype": None,
            "memory_budget": None, "offload": 0.5, "overrides": {}}
    assert kernel_warmup.main([json.dumps(spec)]) == 0
    assert capsys.readouterr() == ("", "")


def test_nothing_starts_when_the_kernels_are_cached():
    simulate(h.device(), h.model(), trace=h.trace(h.model(), 12), decode_tokens=2, warmup_tokens=1, offload=0.5)
    assert not kernel_warmup.needed()  # this process compiled (or loaded) them, so they are on disk
    assert kernel_warmup.start(None) is None


def test_stop_ends_a_running_helper():
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    kernel_warmup.stop(proc)
    assert proc.poll() is not None
    kernel_warmup.stop(None)


def test_a_tiny_trace_is_reproducible():
    a, b = (kernel_warmup.tiny_trace(h.model(), seed=1) for _ in range(2))
    assert all(np.array_equal(x.ids, y.ids) for x, y in zip(a.chunks(), b.chunks(), strict=True))
