"""Design-space exploration: sweeps over run options and profile fields, and the planner.

- :mod:`sim.explore.spec`: the sweep spec (YAML) and its expansion into points;
- :mod:`sim.explore.resolve`: a point's settings resolved into a complete, hashable task;
- :mod:`sim.explore.point_checks`: every point's options checked before a sweep runs any;
- :mod:`sim.explore.sweep`: :func:`run_sweep`, crash-safe and resumable, in-process, on
  local worker processes or on a Dask cluster (:mod:`sim.explore.executors`);
- :mod:`sim.explore.store`: durable Parquet parts and compaction;
- :mod:`sim.explore.planner`: :func:`plan`, the PowerInfer-2 knob search.

Figures of results are in :mod:`sim.plots` (:mod:`sim.plots.sweep_lines`, :func:`sim.plots.plot_sweep_heatmap`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_spec", "plan", "read_results", "run_sweep"]


def __getattr__(name: str) -> Any:  # lazy: importing the package stays cheap
    if name == "run_sweep":
        from sim.explore.sweep import run_sweep

        return run_sweep
    if name == "load_spec":
        from sim.explore.spec import load_spec

        return load_spec
    if name == "plan":
        from sim.explore.planner import plan

        return plan
    if name == "read_results":
        from sim.explore.store import read_results

        return read_results
    raise AttributeError(name)
