"""What matters: Morris screening of decode tokens/s over calibrated unknowns and profile fields.

The inputs are the calibrated unknowns that reach the run (over their prior ranges, in the
fit's coordinates) and a few physical profile fields as scale factors over [1/2, 2] (log):
the flash curves, the CPU clusters' compute, their DRAM reach, the issuing cores' 4 KiB rate,
the flash latency. SALib's Morris method (Campolongo's ``mu_star``, the mean absolute
elementary effect) ranks them with ``trajectories x (inputs + 1)`` analytic evaluations
(:func:`sim.engine.reevaluate.analytic_decode_tokens_per_s`, which keeps the trace and the
plans when only device speeds change). Sobol indices would need ``N x (2k + 2)`` evaluations
with N in the hundreds, minutes per input here, so screening is what is affordable.

How many trajectories: on the default run (TurboSparse-Mixtral-47B, OnePlus 12, 19 GB) the
third and fourth inputs (the flash curves and the Mixtral density) are within 5% of each
other in ``mu_star`` (2.05 against 1.96 over 2,500 trajectories), and one trajectory's
elementary effect of the flash curves spreads widely (it matters when the token is
flash-bound, little when it is CPU-bound). At the former default of 8 trajectories two
sampler seeds gave the same top three 22% of the time (resampled from 1,024 evaluated
trajectories), at 256 84%. Where the analytic mode is split (:func:`~sim.engine.reevaluate.splits`:
PowerInfer-2) an evaluation that changes only device speeds costs milliseconds and the
dearer inputs take :data:`LEVELS` values each, evaluated once per combination
(:func:`evaluation_order`), so :data:`SPLIT_TRAJECTORIES` are affordable (138-144 s for the
default run on a shared 2-core machine, load 2.4-3.3); elsewhere every evaluation is a whole analytic run
and :data:`WHOLE_TRAJECTORIES` is what fits in minutes. Neighbours in the ranking whose
``mu_star`` intervals overlap are flagged (``tied_with_next``): their order is not resolved.
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
SPLIT_TRAJECTORIES = 1000  # the default where an evaluation re-prices kept plans (ms)
WHOLE_TRAJECTORIES = 8  # the default where an evaluation is a whole analytic run (s)
LEVELS = 4


def default_trajectories(config: Any) -> int:
    """Morris trajectories for ``config`` by default (the module docstring says why)."""
    from sim.engine.reevaluate import splits

    return SPLIT_TRAJECTORIES if splits(config.strategy) else WHOLE_TRAJECTORIES


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


# What an input's change costs the analytic re-evaluation, dearest first: a trace-preset value
# generates another trace and replays the cache on it (seconds), a model or knob value may
# replan the tokens, a device field only re-prices the kept plans (milliseconds).
_COST = {"preset": 0, "model": 1, "knobs": 2, "device": 3}


def evaluation_order(x: np.ndarray, items: list[tuple[str, Any]]) -> np.ndarray:
    """The rows of the design ``x`` in the order to evaluate them: sorted by the dearest inputs'
    values, so all rows sharing a trace and plans run together and each trace is made and
    replayed once (with :data:`LEVELS` levels there are few), whatever the number of
    trajectories. The figures do not depend on the order (the re-evaluation is exact)."""
    dear = sorted((i for i, (_name, what) in enumerate(items) if not isinstance(what, str)),
                  key=lambda i: _COST.get(items[i][1].kind, len(_COST)))
    if not dear:
        return np.arange(len(x))
    return np.lexsort([x[:, i] for i in reversed(dear)])  # lexsort's last key is the primary one


def morris(uncalibrated: Any, calibration: Any, *, selection: str | None = None,
           trajectories: int | None = None, seed: int = 0, user_paths: tuple[str, ...] = ()) -> list[dict]:
    """Rows (input, mu_star, mu, sigma, mu_star_conf, kind, tied_with_next), most influential first;
    ``trajectories`` None: :func:`default_trajectories`."""
    from SALib.analyze import morris as analyze
    from SALib.sample import morris as sample

    from sim.errors import SimError

    items = inputs(uncalibrated, calibration, selection, user_paths)
    if len(items) < 2:
        raise SimError(f"needs at least two inputs to rank, got {len(items)}", field="--params")
    problem = {"num_vars": len(items), "names": [n for n, _ in items], "bounds": [[0.0, 1.0]] * len(items)}
    if trajectories is None:
        trajectories = default_trajectories(uncalibrated)
    x = sample.sample(problem, trajectories, num_levels=LEVELS, seed=seed)
    y = np.empty(len(x))
    for i in evaluation_order(x, items):
        y[i] = _evaluate(uncalibrated, calibration, items, x[i], user_paths)
    res = analyze.analyze(problem, x, y, num_levels=LEVELS, seed=seed)
    rows = [{"input": n, "mu_star": float(res["mu_star"][i]), "mu": float(res["mu"][i]),
             "sigma": float(res["sigma"][i]), "mu_star_conf": float(res["mu_star_conf"][i]),
             "kind": "profile field" if isinstance(items[i][1], str) else "calibrated unknown"}
            for i, n in enumerate(problem["names"])]
    rows.sort(key=lambda r: -r["mu_star"])
    for r, nxt in zip(rows, [*rows[1:], None], strict=True):  # mu* intervals that overlap: order unresolved
        r["tied_with_next"] = nxt is not None and r["mu_star"] - r["mu_star_conf"] <= (
            nxt["mu_star"] + nxt["mu_star_conf"])
    return rows
