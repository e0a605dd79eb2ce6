"""Estimate unknowns on published points: bounded least squares on log(predicted / published).

The fit is what the field's calibrated performance models do (LLMCompass, GenZ, a roofline
calibrated on a device): a few named unknowns, estimated on declared measurements, then
used to predict others. Its guards keep it honest: every point counts once, there are
never more free parameters than half the points they are fitted on, every parameter
reaches at least one point, and a value that ends at its prior's bound is reported as the
sign of a missing mechanism rather than hidden.

The optimiser works in each unknown's unit coordinates (0..1 across the prior, log-spaced
for a ``log`` transform); the uncertainty is the usual Gauss-Newton one,
``sqrt(diag((J^T J)^-1) * s^2)`` with ``s^2`` the residual variance, mapped back to the value.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.calibrate.apply import applicable
from sim.calibrate.evaluator import Evaluator
from sim.calibrate.unknowns import Unknown
from sim.errors import SimError

# Finite-difference step in unit coordinates: a DES prediction is piecewise constant at
# tiny scales (integer neuron counts, a fixed seed), so a step far above float noise.
DIFF_STEP = 0.04
# The search's resolution in unit coordinates (a thousandth of each prior's width): trial
# points are evaluated on this grid, and the search stops once its steps are this short. Below
# it, predictions differ by the trace's sampling alone, and a trust region shrinking towards a
# value at its bound otherwise re-simulated every point a dozen times at steps of 1e-5 to 1e-12,
# then took a noise "improvement" for a step and paid a whole Jacobian there (a third of the
# default calibration's time).
RESOLUTION = 1e-3
AT_BOUND = 0.01  # within 1% of the prior's width of an end: "at its bound"
MIN_PULL_SHARE = 0.01  # a point under 1% of the pull towards a bound is not listed
# scipy.optimize.least_squares's losses: plain least squares, or robust ones that weigh a residual
# beyond ROBUST_SCALE less than its square (soft_l1 and huber: like its size; cauchy and arctan:
# ever less, so a point no value can reach stops pulling once it is far off)
LOSSES = ("linear", "soft_l1", "huber", "cauchy", "arctan")
ROBUST_SCALE = 0.2  # the robust losses' scale in log units: ~20%, about the published points' tolerance
# How the search gets its Jacobians after the first (always by differences): ``difference``
# re-measures every column at each accepted step; ``secant`` updates the last one along the
# step just taken (Broyden's rank-one update, as MINPACK's hybrid solvers do), which costs no
# run beyond the step's own residuals. A difference Jacobian is most of a fit's runs (each
# column is a simulation of every point the unknown reaches, and a preset's column a new trace).
JACOBIANS = ("difference", "secant")


@dataclass
class FitResult:
    """Fitted values, their 1-sigma uncertainty, and the points' residuals before and after."""

    unknowns: list[Unknown]
    values: dict[str, float]
    sigma: dict[str, float]
    at_bound: list[str]
    points: list[str]
    residuals: dict[str, float]  # log(predicted / published) at the fitted values
    initial_residuals: dict[str, float]
    evaluations: int
    decode_tokens: int
    warnings: list[str] = field(default_factory=list)
    # per point, per unknown: |d log(predicted) / d unit coordinate|, the largest of the start's,
    # the solution's and the priors' centres' (what a cross-validation fold, which starts at the
    # centres, uses to see which unknowns its points move)
    sensitivity: dict[str, dict[str, float]] = field(default_factory=dict)
    # scipy's cost at the solution: half the sum of the loss over the points (what a
    # cross-validation fold compares between its starts)
    cost: float = math.nan
    # per unknown at its bound, per point: its share of the pull towards that bound (negative:
    # away from it); see bound_pulls
    pulls: dict[str, dict[str, float]] = field(default_factory=dict)

    def values_by_unknown(self) -> dict[Unknown, float]:
        return {u: self.values[u.name] for u in self.unknowns}


def check_fit(points: list[Mapping[str, Any]], unknowns: list[Unknown]) -> None:
    """Refuse a fit that could not be honest, before anything runs (each error names the flag)."""
    ids = [str(p["id"]) for p in points]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise SimError(f"point {', '.join(map(repr, twice))} is selected more than once; each published figure "
                       "counts once", field="--points")
    not_modelled = [str(p["id"]) for p in points if p.get("modelled") is False]
    if not_modelled:
        raise SimError(f"{', '.join(not_modelled)} {'is' if len(not_modelled) == 1 else 'are'} not modelled "
                       "(no run reproduces the figure); leave them out", field="--points")
    names = [u.name for u in unknowns]
    if not unknowns:
        raise SimError("no unknown selected", field="--params")
    if len(set(names)) != len(names):
        raise SimError("an unknown is selected twice", field="--params")
    if 2 * len(unknowns) > len(points):
        raise SimError(f"{len(unknowns)} free parameters on {len(points)} points: at most half as many parameters "
                       f"as points (at most {len(points) // 2} here); select fewer with --params or more "
                       "points with --points", field="--params")
    for unknown in unknowns:
        if not any(unknown in applicable([unknown], p) for p in points):
            raise SimError(f"{unknown.name} reaches none of the selected points (its scope: {unknown.scope})",
                           field="--params")


def fit(points: list[Mapping[str, Any]], unknowns: list[Unknown], *, decode_tokens: int = 64,
        max_evals: int = 200, start: Mapping[str, float] | None = None,
        progress: Callable[[int, float], None] | None = None, runs: dict[tuple, float] | None = None,
        evaluator: Evaluator | None = None, loss: str = "linear", f_scale: float = ROBUST_SCALE,
        fixed: Mapping[Unknown, float] | None = None, sensitivity: bool = True,
        jacobian_updates: str = "difference") -> FitResult:
    """Fit ``unknowns`` to ``points`` (published.yaml entries) and return the estimate.

    Predictions go through ``evaluator`` (memoised by point and the values in its scope, run
    in parallel where a step needs several); without one, a one-process evaluator over
    ``runs``. ``start`` (names to values) is where the search begins, the prior's centre
    otherwise. ``loss`` is scipy's: ``linear`` is plain least squares; ``soft_l1`` weighs a
    residual beyond ``f_scale`` (in log units) less than its square, so one point whose gap no
    value can close (a missing mechanism, which the result still reports) cannot drag every
    value towards its bound. ``fixed``: other unknowns' values, applied to the points they
    reach but not fitted (a cross-validation fold's). ``sensitivity``: also measure which
    unknowns move which points at the solution and the priors' centres (two more Jacobians;
    a calibration's folds use the full fit's, and need none of their own).
    ``jacobian_updates`` (see JACOBIANS): ``secant`` measures the Jacobian by differences at
    the start only and updates it along each accepted step; the reported uncertainty then
    rests on that updated Jacobian (a cross-validation fold, which reports none, uses it).
    """
    from scipy.optimize import least_squares

    check_fit(points, unknowns)
    if loss not in LOSSES:
        raise SimError(f"must be one of {', '.join(LOSSES)}, got {loss!r}", field="--loss")
    if jacobian_updates not in JACOBIANS:
        raise SimError(f"must be one of {', '.join(JACOBIANS)}, got {jacobian_updates!r}", field="--cv-jacobian")
    own = evaluator is None
    ev = Evaluator(decode_tokens, runs=runs) if evaluator is None else evaluator
    published = np.array([float(p["published"]) for p in points])
    evaluations = 0
    held = dict(fixed or {})
    scoped = [applicable([*unknowns, *held], p) for p in points]

    def values_at(u: np.ndarray) -> dict[Unknown, float]:
        return {unk: unk.from_unit(float(x)) for unk, x in zip(unknowns, u, strict=True)}

    def all_values(u: np.ndarray) -> dict[Unknown, float]:
        return {**held, **values_at(u)}

    def requests(u: np.ndarray) -> list[tuple[Mapping[str, Any], dict[Unknown, float]]]:
        vals = all_values(u)
        return [(p, {k: vals[k] for k in mine}) for p, mine in zip(points, scoped, strict=True)]

    def residuals(u: np.ndarray) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        asked = requests(u)
        ev.ensure(asked)
        predicted = np.array([ev.get(p, vals) for p, vals in asked])  # positive: predict() checks
        r = np.log(predicted / published)
        if progress is not None:
            progress(evaluations, float(np.sum(r * r)))
        return r

    memo: dict[bytes, np.ndarray] = {}

    def cached(u: np.ndarray) -> np.ndarray:
        u = on_grid(u)
        key = u.tobytes()
        if key not in memo:
            memo[key] = residuals(u)
        return memo[key]

    def steps(u: np.ndarray) -> list[np.ndarray]:
        out = []
        for i, unk in enumerate(unknowns):
            step = u.copy()
            step[i] += _step(unk, float(u[i]))
            out.append(step)
        return out

    def jacobian(u: np.ndarray) -> np.ndarray:
        """Forward differences with an absolute step in unit coordinates (backward near the top
        bound): scipy's own step is relative to x, which vanishes near the lower bound. Every
        column's runs are asked for at once, so they run in parallel."""
        u = on_grid(u)
        trials = [on_grid(s) for s in steps(u)]
        ev.ensure([req for s in [u, *trials] for req in requests(s)])
        r = cached(u)
        jac = np.empty((len(r), len(u)))
        for i, s in enumerate(trials):
            jac[:, i] = (cached(s) - r) / (s[i] - u[i])
        return jac

    last: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # the Jacobian handed out last, and where

    def secant(u: np.ndarray) -> np.ndarray:
        """The first Jacobian by differences, each later one the last updated along the step
        from where it held to ``u``."""
        u = on_grid(u)
        r = cached(u)
        if last:
            u_was, r_was, jac_was = last[0]
            jac = broyden_update(jac_was, u - u_was, r - r_was)
        else:
            jac = jacobian(u)
        last[:] = [(u, r, jac)]
        return jac

    jac_of = secant if jacobian_updates == "secant" else jacobian

    try:
        u0 = np.array([unk.to_unit(float(start[unk.name])) if start and unk.name in start else 0.5
                       for unk in unknowns])
        u0 = np.clip(u0, 0.0, 1.0)
        r0 = cached(u0)
        jac0 = jac_of(u0)
        # scipy gets copies: under a robust loss scipy 1.11 (this project's floor; 1.17 copies them
        # itself) scales the residuals and Jacobian it is handed in place, which would rewrite the
        # memo's residuals and the Jacobian a secant update starts from
        sol = least_squares(lambda u: cached(u).copy(), u0, jac=lambda u: jac_of(u).copy(), bounds=(0.0, 1.0),
                            max_nfev=max_evals, x_scale=1.0, method="trf", loss=loss, f_scale=f_scale,
                            xtol=RESOLUTION)
        x = on_grid(sol.x)  # where its residuals were evaluated
        ends = [jac0]
        jac_x = r_x = None
        if sensitivity:
            jac_x = jacobian(x)
            r_x = cached(x)
            ends.append(jac_x)
            # where the folds start (the priors' centres) too, when the search began elsewhere: a fold
            # judges which unknowns its points move there, not only where a warm start and the solution lie
            centre = np.full(len(unknowns), 0.5)
            if not np.allclose(u0, centre):
                ends.append(jacobian(centre))
    finally:
        if own:
            ev.close()
    values = values_at(x)
    dof = max(len(points) - len(unknowns), 1)
    s2 = float(np.sum(sol.fun ** 2)) / dof
    sigma: dict[str, float] = {}
    try:
        cov_u = np.linalg.pinv(sol.jac.T @ sol.jac) * s2
        for i, unk in enumerate(unknowns):
            su = math.sqrt(max(float(cov_u[i, i]), 0.0))
            xi = float(x[i])
            hi, lo = unk.from_unit(min(xi + su, 1.0)), unk.from_unit(max(xi - su, 0.0))
            sigma[unk.name] = abs(hi - lo) / 2
    except np.linalg.LinAlgError:
        sigma = {unk.name: math.nan for unk in unknowns}
    at_bound = [unk.name for unk, xi in zip(unknowns, x, strict=True)
                if xi <= AT_BOUND or xi >= 1 - AT_BOUND or values[unk] in (unk.from_unit(0.0), unk.from_unit(1.0))]
    ids = [str(p["id"]) for p in points]
    pulls = ({} if jac_x is None or r_x is None else
             bound_pulls(ids, r_x, jac_x, loss_weight(loss, r_x, f_scale), unknowns, x, at_bound))
    warnings = [f"{name} ended at its prior's bound: a sign of a missing mechanism, not a value to trust"
                + pull_text(pulls.get(name, {})) for name in at_bound]
    moved = np.max(np.abs(np.stack(ends)), axis=0)
    return FitResult(unknowns, {u.name: v for u, v in values.items()}, sigma, at_bound, ids,
                     dict(zip(ids, sol.fun.tolist(), strict=True)), dict(zip(ids, r0.tolist(), strict=True)),
                     evaluations, decode_tokens, warnings,
                     {i: {u.name: float(s) for u, s in zip(unknowns, row, strict=True)}
                      for i, row in zip(ids, moved, strict=True)}, float(sol.cost), pulls)


def loss_weight(loss: str, r: np.ndarray, f_scale: float) -> np.ndarray:
    """How much each residual's slope counts in the fit's gradient: scipy's rho'(z) at
    z = (r / f_scale)^2 (1 for least squares; under a robust loss a far-off point counts less)."""
    z = (np.asarray(r, dtype=float) / f_scale) ** 2
    if loss == "soft_l1":
        return 1.0 / np.sqrt(1.0 + z)
    if loss == "huber":
        return 1.0 / np.sqrt(np.maximum(z, 1.0))
    if loss == "cauchy":
        return 1.0 / (1.0 + z)
    if loss == "arctan":
        return 1.0 / (1.0 + z * z)
    return np.ones_like(z)


def bound_pulls(ids: list[str], r: np.ndarray, jac: np.ndarray, weight: np.ndarray, unknowns: list[Unknown],
                x: np.ndarray, at_bound: list[str]) -> dict[str, dict[str, float]]:
    """For each unknown at its bound, which points hold it there: the reader's first lead to the
    missing mechanism. The cost's slope along unknown j is the sum over points of
    ``weight_i * r_i * J_ij``; a point whose term points past the bound pulls the value there.
    Each point's term is given as a share of the total pull towards the bound (negative: it
    pulls away), points under MIN_PULL_SHARE of it left out, largest first."""
    out: dict[str, dict[str, float]] = {}
    for j, unk in enumerate(unknowns):
        if unk.name not in at_bound:
            continue
        towards = 1.0 if x[j] < 0.5 else -1.0  # at the floor a rising cost pulls the value down
        pull = towards * weight * r * jac[:, j]
        total = float(pull[pull > 0].sum())
        if total <= 0:
            out[unk.name] = {}
            continue
        shares = {i: round(float(p) / total, 3) for i, p in zip(ids, pull, strict=True)
                  if abs(p) >= MIN_PULL_SHARE * total}
        out[unk.name] = dict(sorted(shares.items(), key=lambda kv: -kv[1]))
    return out


def pull_text(shares: Mapping[str, float], most: int = 3) -> str:
    """The points pulling a value to its bound, as a warning's tail ("" when there are none)."""
    towards = [f"{i} {s:.0%}" for i, s in shares.items() if s > 0][:most]
    away = -sum(s for s in shares.values() if s < 0)
    if not towards:
        return ""
    if away >= 1:  # the points pull it into the prior: the search, not the points, stopped at the bound
        return (f"; the points pull it back into the prior ({away:.0%} as hard as {', '.join(towards)} pull "
                "it there): the search stopped at the bound, a flat or noisy cost there, not the points")
    tail = f"; the points pulling it there (share of the pull): {', '.join(towards)}"
    return tail + (f"; others pull back {away:.0%} as hard" if away >= 0.005 else "")


def broyden_update(jac: np.ndarray, du: np.ndarray, dr: np.ndarray) -> np.ndarray:
    """Broyden's ("good") rank-one update of ``jac`` after a step ``du`` changed the residuals
    by ``dr``: the least change (in the Frobenius norm) that reproduces ``dr`` over that step;
    across every direction orthogonal to the step the Jacobian stays as it was."""
    norm = float(du @ du)
    if norm == 0.0:
        return jac
    return jac + np.outer(dr - jac @ du, du) / norm


def on_grid(u: np.ndarray) -> np.ndarray:
    """``u`` rounded to the search's grid (RESOLUTION), inside the unit box."""
    return np.clip(np.round(np.asarray(u, dtype=float) / RESOLUTION) * RESOLUTION, 0.0, 1.0)


def _step(unknown: Unknown, u: float) -> float:
    """A difference step in unit coordinates that moves the value: DIFF_STEP (backwards near
    the top bound), widened for an integer unknown until its rounded value changes (else its
    gradient reads zero)."""
    sign = 1.0 if u + DIFF_STEP <= 1.0 else -1.0
    h = DIFF_STEP
    while unknown.integer and h < 0.5 and unknown.from_unit(min(max(u + sign * h, 0.0), 1.0)) == unknown.from_unit(u):
        h = math.ceil(1.5 * h / RESOLUTION) * RESOLUTION  # on the search's grid
    return sign * h


def today() -> str:
    return datetime.date.today().isoformat()
