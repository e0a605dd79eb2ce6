"""Tiny models, traces and device variants for the engine tests.

Every run here uses a 2-3 layer model written to a temporary YAML file and a short
synthetic trace, so one ``simulate`` call takes a few milliseconds; the device is the
bundled OnePlus 12 (or a copy with one field changed), and assertions compare runs with
each other or with physical bounds, never with fixed numbers.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from sim.profiles.device import BUNDLED_DIR as DEVICE_DIR
from sim.profiles.device import DeviceProfile
from sim.profiles.model import ModelProfile
from sim.traces.format import Trace
from sim.traces.params import SynthDims, SynthParams, params_from_mapping
from sim.traces.synth import synth_trace

TINY_MOE: dict[str, Any] = {
    "name": "tiny-moe", "family": "mixtral", "n_layers": 2, "hidden": 256, "ffn_dim": 1024, "n_heads": 4,
    "n_kv_heads": 2, "vocab": 1000, "max_context": 512, "ffn_gated": True, "activation": "drelu",
    "moe": {"n_experts": 4, "top_k": 2}, "sparsity": {"mean_active_fraction": 0.15, "source": "test"},
    "predictor": {"rank": 16, "dtype": "fp16", "per_expert": True, "source": "test"},
    "default_dtype": "int4", "published_params_b": 0.0072, "source": "test",
}
TINY_DENSE: dict[str, Any] = {
    "name": "tiny-dense", "family": "llama", "n_layers": 3, "hidden": 256, "ffn_dim": 2048, "n_heads": 4,
    "n_kv_heads": 4, "vocab": 1000, "max_context": 512, "ffn_gated": True, "activation": "relu",
    "sparsity": {"mean_active_fraction": 0.1, "source": "test"},
    "predictor": {"rank": 16, "dtype": "fp16", "per_expert": False, "source": "test"},
    "default_dtype": "int4", "published_params_b": 0.006, "source": "test",
}
# Skewed, persistent activity with an imperfect predictor, as the presets have.
PARAMS: dict[str, Any] = {
    "name": "test-params",
    "density": {"value": 0.15, "assumed": "test"},
    "propensity": {"dist": "logitnormal", "sigma": 2.0, "assumed": "test"},
    "persistence": {"value": 0.6, "assumed": "test"},
    "routing": {"assumed": "test"},
    "predictor": {"recall": 0.95, "precision": 0.9, "assumed": "test"},
}


def model(raw: dict[str, Any] = TINY_MOE, **changes: Any) -> ModelProfile:
    data = copy.deepcopy(raw)
    data.update(changes)
    return ModelProfile.model_validate(data)


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@functools.lru_cache(maxsize=1)
def params() -> SynthParams:
    return params_from_mapping(copy.deepcopy(PARAMS), "<test params>")


@functools.lru_cache(maxsize=32)
def _trace(name: str, n_tokens: int, seed: int, predictions: bool) -> Trace:
    raw = TINY_MOE if name == TINY_MOE["name"] else TINY_DENSE
    dims = SynthDims.from_model(model(raw))
    return synth_trace(params(), dims, n_tokens, seed, chunk_tokens=16, predictions=predictions).materialise()


def trace(m: ModelProfile, n_tokens: int, seed: int = 0, predictions: bool = True) -> Trace:
    """A materialised synthetic trace for one of the tiny models (cached per arguments)."""
    return _trace(m.name, n_tokens, seed, predictions)


@functools.lru_cache(maxsize=1)
def _device_data() -> dict[str, Any]:
    return yaml.safe_load((DEVICE_DIR / "oneplus-12.yaml").read_text())


def device_data() -> dict[str, Any]:
    """The bundled OnePlus 12 as a mutable mapping (a fresh copy each call)."""
    return copy.deepcopy(_device_data())


def device(data: dict[str, Any] | None = None) -> DeviceProfile:
    return DeviceProfile.model_validate(data if data is not None else device_data())


def scaled_storage(factor: float, data: dict[str, Any] | None = None) -> DeviceProfile:
    """The device with every point of its sequential and random read curves times ``factor``."""
    data = data if data is not None else device_data()
    for curve in ("seq_read", "rand_read"):
        for point in data["storage"][curve]:
            point["gbps"] *= factor
    return device(data)


def with_cores(cluster: str, cores: int, data: dict[str, Any] | None = None) -> DeviceProfile:
    data = data if data is not None else device_data()
    for c in data["cpu"]["clusters"]:
        if c["name"] == cluster:
            c["cores"] = cores
    return device(data)


def summary_without_wall(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "wall_s"}
