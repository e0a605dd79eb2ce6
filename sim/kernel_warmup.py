"""A first run compiles the engine's kernels in a second process while it makes its trace.

numba compiles one kernel at a time per process (a global lock), and a fresh install's first
``sim run`` spends most of its time compiling: first the trace generator's kernels (the
trace is made before the engine runs), then the engine's. The engine's need nothing from the
trace, so :func:`start` runs ``python -m sim.kernel_warmup`` beside the command when they are
not in numba's cache yet: the same configuration on a four-token random trace of the model's
shape, which compiles the same kernels with the same argument types and leaves them in the
cache, where the command finds them when it gets there (on a machine with a free core, the
two halves of the compilation take the time of the longer one). The helper writes nothing
but numba's cache files, prints nothing, and is stopped when the command is done.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from typing import Any

import numpy as np


def needed() -> bool:
    """Whether the engine's kernels still have to be compiled (every run's first one, the
    offline profile's counter, is not in numba's cache)."""
    from sim.engine import workload

    try:
        return not workload._add_counts._cache._cache_file._load_index()
    except Exception:  # numba internals of another version: just do not help
        return False


def start(config: Any) -> subprocess.Popen | None:
    """Start compiling the engine's kernels for ``config`` (a RunConfig) in the background, or
    None when they are cached already."""
    if not needed():
        return None
    spec = {"device": _plain(config.device), "model": _plain(config.model), "strategy": config.strategy,
            "knobs": dict(config.knobs), "policy": config.policy, "mode": config.mode,
            "weights_dtype": config.weights_dtype, "memory_budget": _plain(config.memory_budget),
            "offload": config.offload, "overrides": dict(config.overrides)}
    try:
        return subprocess.Popen([sys.executable, "-m", "sim.kernel_warmup", json.dumps(spec, default=str)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None


def stop(proc: subprocess.Popen | None) -> None:
    """End the helper if it still runs (whatever it compiled by now is in the cache)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _plain(value: Any) -> Any:
    """A profile object as its mapping (the helper rebuilds it); names, paths and sizes as they are."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def tiny_trace(model: Any, n_tokens: int = 4, density: float = 0.05, seed: int = 0) -> Any:
    """A random trace of ``model``'s shape (with predicted sets), a few tokens long."""
    from sim.traces.format import Trace, TraceMeta

    rng = np.random.default_rng(seed)
    meta = TraceMeta(model=model.name, n_layers=model.n_layers, n_neurons=model.ffn_dim, hidden=model.hidden,
                     n_experts=model.n_experts, top_k=model.top_k, chunk_tokens=n_tokens, source="synthetic")
    rows = n_tokens * model.n_layers * model.top_k

    def row() -> np.ndarray:
        return np.flatnonzero(rng.random(model.ffn_dim) < density).astype(np.int32)

    experts = np.argsort(rng.random((n_tokens, model.n_layers, model.n_experts)), axis=2)[:, :, :model.top_k]
    return Trace.from_rows(meta, [row() for _ in range(rows)], experts.astype(np.int16), [row() for _ in range(rows)])


def main(argv: list[str]) -> int:
    from sim.engine.simulation import check_options, simulate
    from sim.profiles.device import DeviceProfile
    from sim.profiles.model import ModelProfile

    spec = json.loads(argv[0])
    for kind, schema in (("device", DeviceProfile), ("model", ModelProfile)):
        if isinstance(spec[kind], dict):
            spec[kind] = schema.model_validate(spec[kind])
    run = {**spec, "prompt_tokens": 2, "decode_tokens": 2, "warmup_tokens": 1, "profile_tokens": 1}
    model = check_options(**run).model  # after the run's profile edits: the trace has its shape
    simulate(**run, trace=tiny_trace(model))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
