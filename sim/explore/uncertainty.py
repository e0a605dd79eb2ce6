"""Prediction intervals: the calibrated unknowns' uncertainty carried through a run by sampling.

Each calibrated unknown that reaches the run (its scope covers it) is drawn from what is known
about it *for this run*:

- the calibration's value and its ``sigma`` (a normal, cut to the prior range), when the
  run's device and model are among those of the published points the calibration was fitted
  on: the fit constrains the value for this hardware and model;
- its whole prior range (uniform in the fit's coordinates, log or linear), when the run's
  device or model is one no published point covers: the fitted value was learnt on other
  hardware, so only the prior says what it may be here.

The samples (a Latin hypercube, seeded) are evaluated in the analytic mode, through the cheap
re-evaluation (:func:`sim.engine.reevaluate.analytic_decode_tokens_per_s`, which keeps the
trace and the cache's plans when only device speeds change), and each is scaled by the DES's
ratio to the analytic mode at the calibrated values, so the interval sits on the figure the
run prints (where the two modes agree that ratio is 1; a test holds their agreement). The
median and the 5th-95th percentiles are the 90% interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_SAMPLES = 24
LEVEL = 0.90


@dataclass(frozen=True)
class Interval:
    median: float
    lo: float
    hi: float
    samples: list[float]
    sources: dict[str, str]  # unknown -> "calibration" or "prior"


class _Values:
    """One draw, in the shape :func:`sim.calibrate.apply.calibrated_config` applies."""

    def __init__(self, values: dict[Any, float]):
        self._values = values

    def in_sample(self) -> dict[Any, float]:
        return self._values


def covered(calibration: Any) -> tuple[set[str], set[str]]:
    """(devices, models) of the published points the calibration was fitted on."""
    from sim.profiles.registry import load_model
    from sim.validation import load_points

    fitted = set(calibration.points)
    devices, models = set(), set()
    for p in load_points():
        if isinstance(p, dict) and str(p.get("id")) in fitted:
            devices.add(str(p.get("device")))
            if p.get("model"):
                models.add(load_model(p["model"]).name)
    return devices, models


def sampled_unknowns(config: Any, calibration: Any, user_paths: tuple[str, ...] = ()) -> dict[Any, str]:
    """The unknowns that reach ``config`` (scope covers it, not set by the user), each with
    where its spread comes from: ``calibration`` or ``prior``."""
    from sim.calibrate.apply import applicable, run_facts
    from sim.profiles.registry import load_device, load_model

    facts = run_facts(config)
    mine = set(user_paths)
    reach = [u for u in applicable(calibration.unknowns, {**facts, "device": config.device, "model": config.model})
             if not ({f"{u.kind}.{u.field_path}", u.field_path} & mine)]
    devices, models = covered(calibration)
    known = load_device(config.device).name in devices and load_model(config.model).name in models
    return {u: ("calibration" if known and u.name in calibration.values and
                math.isfinite(calibration.sigma.get(u.name, math.nan)) else "prior") for u in reach}


def draws(unknowns: dict[Any, str], calibration: Any, n: int, seed: int) -> list[dict[Any, float]]:
    """``n`` Latin-hypercube draws of the unknowns (see the module docstring)."""
    from scipy.stats import norm, qmc

    names = list(unknowns)
    if not names:
        return []
    cube = qmc.LatinHypercube(d=len(names), seed=seed).random(n)
    out = []
    for row in cube:
        values = {}
        for u, q in zip(names, row, strict=True):
            if unknowns[u] == "prior":
                values[u] = u.from_unit(float(q))
            else:
                lo, hi = u.prior
                mu, sd = calibration.values[u.name], calibration.sigma[u.name]
                # the normal cut to the prior: its quantile q within [cdf(lo), cdf(hi)]
                a, b = norm.cdf((lo - mu) / sd), norm.cdf((hi - mu) / sd)
                x = mu + sd * float(norm.ppf(a + q * (b - a)))
                values[u] = float(round(x)) if u.integer else min(hi, max(lo, x))
        out.append(values)
    return out


def prediction_interval(uncalibrated: Any, calibration: Any, des_figure: float, *, samples: int = DEFAULT_SAMPLES,
                        seed: int = 0, user_paths: tuple[str, ...] = ()) -> Interval:
    """The 90% interval of decode tokens/s over the unknowns' uncertainty (the module docstring)."""
    from sim.calibrate.apply import calibrated_config
    from sim.engine.reevaluate import analytic_decode_tokens_per_s

    def analytic(values: Any) -> float:
        cfg = calibrated_config(uncalibrated, values, user_paths=user_paths)
        return analytic_decode_tokens_per_s(cfg.model_copy(update={"mode": "analytic"}))

    unknowns = sampled_unknowns(uncalibrated, calibration, user_paths)
    nominal = analytic(calibration)
    ratio = des_figure / nominal if nominal > 0 and math.isfinite(nominal) else 1.0
    figures = [ratio * analytic(_Values(v)) for v in draws(unknowns, calibration, samples, seed)] or [des_figure]
    tail = (1 - LEVEL) / 2 * 100
    lo, med, hi = (float(x) for x in np.percentile(figures, [tail, 50, 100 - tail]))
    return Interval(med, lo, hi, figures, {u.name: src for u, src in unknowns.items()})
