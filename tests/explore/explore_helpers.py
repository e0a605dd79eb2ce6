"""A tiny MoE model and small sweep specs for the explore tests.

The model (2 layers, 4 experts of 1024 neurons, top-2) is written to a temporary YAML
file and driven by the bundled ``turbosparse-mixtral-47b`` trace preset (presets describe
statistics per layer and neuron rank, so they transfer to any width), so one simulated
point takes tens of milliseconds. Budgets sit just above the ~301 MB that must stay
resident (mostly the 300 MB runtime), so part of the FFN streams from flash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.explore.worker import TIMING_COLUMNS

TINY_MOE: dict[str, Any] = {
    "name": "tiny-moe", "family": "mixtral", "n_layers": 2, "hidden": 256, "ffn_dim": 1024, "n_heads": 4,
    "n_kv_heads": 2, "vocab": 1000, "max_context": 1024, "ffn_gated": True, "activation": "drelu",
    "moe": {"n_experts": 4, "top_k": 2}, "sparsity": {"mean_active_fraction": 0.15, "source": "test"},
    "predictor": {"rank": 16, "dtype": "fp16", "per_expert": True, "source": "test"},
    "default_dtype": "int4", "published_params_b": 0.0072, "source": "test",
}
PRESET = "turbosparse-mixtral-47b"


def write_model(folder: Path) -> Path:
    path = folder / "tiny-moe.yaml"
    path.write_text(yaml.safe_dump(TINY_MOE, sort_keys=False))
    return path


def write_spec(folder: Path, spec: dict[str, Any], name: str = "spec.yaml") -> Path:
    write_model(folder)
    path = folder / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def base(**extra: Any) -> dict[str, Any]:
    """Run options every test spec shares (model path relative to the spec file)."""
    return {"model": "tiny-moe.yaml", "preset": PRESET, "decode_tokens": 4, "warmup_tokens": 4, **extra}


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """Results without the columns that legitimately differ run to run (timing, worker)."""
    return df.drop(columns=[c for c in TIMING_COLUMNS if c in df.columns]).reset_index(drop=True)
