"""Builders for small traces used by the trace tests."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from sim.traces.format import Trace, TraceMeta


def random_trace(rng: np.random.Generator, *, n_layers: int = 2, n_neurons: int = 12, n_experts: int = 1,
                 top_k: int = 1, n_tokens: int = 9, chunk_tokens: int = 4, density: float = 0.3,
                 predictions: bool = False) -> Trace:
    """A trace with random sorted active sets and random distinct experts per (token, layer)."""
    meta = TraceMeta(model="tiny", n_layers=n_layers, n_neurons=n_neurons, hidden=8, n_experts=n_experts,
                     top_k=top_k, chunk_tokens=chunk_tokens, source="recorded")
    rows = n_tokens * n_layers * top_k
    active = [np.flatnonzero(rng.random(n_neurons) < density).astype(np.int32) for _ in range(rows)]
    predicted = [np.flatnonzero(rng.random(n_neurons) < density).astype(np.int32) for _ in range(rows)] \
        if predictions else None
    experts = np.argsort(rng.random((n_tokens, n_layers, n_experts)), axis=2)[:, :, :top_k].astype(np.int16)
    return Trace.from_rows(meta, active, experts, predicted)


def assert_same_arrays(a: Trace, b: Trace) -> None:
    """Both traces hold the same chunks: starts, and every array with its dtype."""
    got = [(c.start, c.offsets, c.ids, c.experts, c.pred_offsets, c.pred_ids) for c in a.chunks()]
    want = [(c.start, c.offsets, c.ids, c.experts, c.pred_offsets, c.pred_ids) for c in b.chunks()]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0]
        for x, y in zip(g[1:], w[1:], strict=True):
            assert (x is None) == (y is None)
            if x is not None:
                assert x.dtype == y.dtype and np.array_equal(x, y)


def write_raw_trace(path: Path, meta: dict[str, Any], members: dict[str, np.ndarray]) -> Path:
    """Write a version-1 trace file member by member, so tests can plant any defect."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in members.items():
            with zf.open(f"{name}.npy", "w") as fh:
                np.lib.format.write_array(fh, np.asarray(arr), allow_pickle=False)
        with zf.open("meta.npy", "w") as fh:
            np.lib.format.write_array(fh, np.frombuffer(json.dumps(meta).encode(), np.uint8), allow_pickle=False)
    return path


def valid_parts() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Metadata and members of a valid 2-token, 2-layer, 8-neuron dense version-1 trace (one chunk)."""
    meta = {"model": "tiny", "n_layers": 2, "n_neurons": 8, "hidden": 4, "n_tokens": 2, "chunk_tokens": 4,
            "source": "recorded", "version": 1}
    members = {"c00000_offsets": np.array([0, 2, 3, 5, 6], np.int64),
               "c00000_ids": np.array([1, 4, 7, 0, 3, 5], np.int32),
               "c00000_experts": np.zeros((2, 2, 1), np.int16)}
    return meta, members


def rewrite_members(src: Path, dst: Path, change: Any) -> Path:
    """Copy trace ``src`` to ``dst`` with each array member passed through ``change(name, array)``
    (names without ``.npy``; ``meta`` is copied as is): a trace written by another tool."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            with zin.open(name) as fh:
                arr = np.lib.format.read_array(fh, allow_pickle=False)
            stem = name.removesuffix(".npy")
            with zout.open(name, "w") as fh:
                np.lib.format.write_array(fh, arr if stem == "meta" else change(stem, arr), allow_pickle=False)
    return dst
