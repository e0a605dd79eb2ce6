"""phonesim: a discrete-event simulator of phones running sparse LLM inference.

The public API, imported lazily so that ``import sim`` stays cheap (the engine pulls in
simpy, numba and pandas)::

    import sim
    device = sim.load_device("oneplus-12")
    result = sim.simulate(device, "turbosparse-mixtral-47b", "powerinfer2", offload=0.5)
    result.summary["decode_tokens_per_s"]
    faster = sim.edit_device(device, {"cpu.clusters.big.cores": 3})  # a what-if, as `sim run --set`
    same = sim.simulate(sim.RunConfig(device="oneplus-12", offload=0.5))  # a run as one object
    sim.analytic_decode_tokens_per_s(sim.RunConfig(device=faster, offload=0.5))  # ms once the trace's plans are kept

The package holds the code; the bundled data lives in top-level folders of the repository
(``device_profiles/``, ``model_profiles/``, ``trace_presets/``, ``validation/``) and ships in
the wheel as ``sim.data.<folder>`` (:mod:`sim.bundled` finds it either way).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_API = {
    "SimError": "sim.errors",
    "load_device": "sim.profiles.registry",
    "load_model": "sim.profiles.registry",
    "edit_device": "sim.profiles.edits",
    "edit_model": "sim.profiles.edits",
    "plan_memory": "sim.profiles.memory",
    "Trace": "sim.traces.format",
    "synth_trace": "sim.traces.synth",
    "make_policy": "sim.cache",
    "RunConfig": "sim.engine.config",
    "simulate": "sim.engine.simulation",
    "check_options": "sim.engine.simulation",
    "SimResult": "sim.engine.simulation",
    "analytic_decode_tokens_per_s": "sim.engine.reevaluate",
    "run_sweep": "sim.explore.sweep",
    "plan": "sim.explore.planner",
    "validate": "sim.validation",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
