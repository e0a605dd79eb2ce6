"""What matters: Morris screening of decode tokens/s over calibrated unknowns and profile fields.

The inputs are the calibrated unknowns that reach the run (over their prior ranges, in the
fit's coordinates) and a few physical profile fields as scale factors over [1/2, 2] (log):
the flash curves, the CPU clusters' compute, their DRAM reach, the issuing cores' 4 KiB rate,
the flash latency. SALib's Morris method (Campolongo's ``mu_star``, the mean absolute
elementary effect) ranks them with ``trajectories x (inputs + 1)`` analytic evaluations
(:func:`sim.engine.reevaluate.analytic_decode_tokens_per_s`, which keeps the trace and the
plans when only device speeds change). Sobol indices would need ``N x (2k + 2)`` evaluations
with N in the hundreds, minutes per input here, so screening is what is affordable.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Profile fields screened by default: a --set key with :scale, over [1/2, 2].
PROFILE_FIELDS = {
    "flash curves": "device.storage.rand_read.*.gbps:scale",
    "CPU compute": "device.cpu.clusters.*.int8_gops:scale",
    "CPU cores' DRAM reach": "device.cpu.clusters.*.mem_gbps:scale",
    "I/O core issue rate": "device.cpu.clusters.*.io_4k_gbps:scale",
    "flash latency": "device.storage.read_latency_us:scale",
}
SCALE = (0.5, 2.0)
DEFAULT_TRAJECTORIES = 8
LEVELS = 4


class _Values:
    def __init__(self, values: dict[Any, float]):
        self._values = values

    def in_sample(self) -> dict[Any, float]:
        return self._values


def inputs(uncalibrated: Any, calibration: Any, selection: str | None = None,
           user_paths: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """(name, what it is): an Unknown, or a profile field's --set key."""
    from sim.calibrate.unknowns import select
    from sim.explore.uncertainty import sampled_unknowns

    items: list[tuple[str, Any]] = []
    if calibration is not None:
        items += [(u.name, u) for u in sampled_unknowns(uncalibrated, calibration, user_paths)]
    items += [(name, key) for name, key in PROFILE_FIELDS.items() if key not in user_paths]
    return select(items, selection, "input", "--params", key=lambda item: item[0])


def _evaluate(uncalibrated: Any, calibration: Any, items: list[tuple[str, Any]], unit: np.ndarray,
              user_paths: tuple[str, ...]) -> float:
    from sim.calibrate.apply import calibrated_config
    from sim.engine.reevaluate import analytic_decode_tokens_per_s

    values = dict(calibration.in_sample()) if calibration is not None else {}
    edits = dict(uncalibrated.overrides)
    lo, hi = math.log(SCALE[0]), math.log(SCALE[1])
    for (_name, what), u in zip(items, unit, strict=True):
        if isinstance(what, str):
            edits[what] = float(math.exp(lo + u * (hi - lo)))
        else:
            values[what] = what.from_unit(float(u))
    cfg = calibrated_config(uncalibrated.model_copy(update={"overrides": edits}), _Values(values),
                            user_paths=user_paths)
    return analytic_decode_tokens_per_s(cfg.model_copy(update={"mode": "analytic"}))


def morris(uncalibrated: Any, calibration: Any, *, selection: str | None = None,
           trajectories: int = DEFAULT_TRAJECTORIES, seed: int = 0, user_paths: tuple[str, ...] = ()) -> list[dict]:
    """Rows (input, mu_star, mu, sigma, mu_star_conf), most influential first."""
    from SALib.analyze import morris as analyze
    from SALib.sample import morris as sample

    from sim.errors import SimError

    items = inputs(uncalibrated, calibration, selection, user_paths)
    if len(items) < 2:
        raise SimError(f"needs at least two inputs to rank, got {len(items)}", field="--params")
    problem = {"num_vars": len(items), "names": [n for n, _ in items], "bounds": [[0.0, 1.0]] * len(items)}
    x = sample.sample(problem, trajectories, num_levels=LEVELS, seed=seed)
    y = np.array([_evaluate(uncalibrated, calibration, items, row, user_paths) for row in x])
    res = analyze.analyze(problem, x, y, num_levels=LEVELS, seed=seed)
    rows = [{"input": n, "mu_star": float(res["mu_star"][i]), "mu": float(res["mu"][i]),
             "sigma": float(res["sigma"][i]), "mu_star_conf": float(res["mu_star_conf"][i]),
             "kind": "profile field" if isinstance(items[i][1], str) else "calibrated unknown"}
            for i, n in enumerate(problem["names"])]
    rows.sort(key=lambda r: -r["mu_star"])
    return rows
