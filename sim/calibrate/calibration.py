"""A calibration: fitted values (in-sample and per cross-validation fold), as a YAML file.

The file is what `sim calibrate` writes and what `sim validate --calibration` applies. It
says how to remake it (the points, the unknowns, the run length), the code version and
the date, each value with its uncertainty and whether it ended at a bound, and for every
held-out source group the values refitted without it. Cross-validation holds out one
*source group* at a time (all points of one figure or table: they share a setting and an
author's method, so holding out one of them alone would leak the rest) and predicts it
from the others.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.bundled import bundled_dir
from sim.calibrate.evaluator import Evaluator
from sim.calibrate.fit import JACOBIANS, FitResult, check_fit, fit, today
from sim.calibrate.unknowns import Unknown, load_unknowns, registry_version
from sim.errors import SimError
from sim.lru import file_version, kept
from sim.profiles.yamlio import load_yaml_file, load_yaml_text

DEFAULT_NAME = "calibration.yaml"
NONE = "none"  # `--calibration none`: the microbenchmark-only prediction
BUNDLED_LABEL = f"bundled validation/{DEFAULT_NAME}"  # how output names the default calibration
# |d log(predicted) / d unit coordinate| below which an unknown does not move a point: a
# difference step of DIFF_STEP then changes the prediction by under 0.004%
SENSITIVE = 1e-3
# `--cv-start`: each fold searches from the priors' centres, or from there and from the full fit's values
CV_STARTS = ("centre", "both")
# the full fit's start must lower the kept points' cost by more than this share to be kept: a
# tie, or a gain within the simulation's step noise, leaves the leak-free centre's solution
WARM_FOLD_MARGIN = 0.05
# Calibration files as parsed, by their version on disk (see load_calibration)
_LOADED: OrderedDict[tuple, Calibration] = OrderedDict()
LOADED_CACHE = 8


def source_group(point: Mapping[str, Any]) -> str:
    """A point's cross-validation group: its figure or table (``[PI2] Fig. 10``)."""
    return str(point["source"]).split("(")[0].strip()


@dataclass
class Calibration:
    """Values to apply: in-sample, and per held-out group (``folds``)."""

    unknowns: list[Unknown]
    values: dict[str, float]
    sigma: dict[str, float]
    at_bound: list[str]
    points: list[str]
    folds: dict[str, dict[str, float]]  # source group -> values fitted without it
    meta: dict[str, Any]
    source: str = "<calibration>"
    # per unknown at its bound, per point: its share of the pull there (FitResult.pulls)
    pulls: dict[str, dict[str, float]] = field(default_factory=dict)

    def by_unknown(self, values: Mapping[str, float]) -> dict[Unknown, float]:
        return {u: float(values[u.name]) for u in self.unknowns if u.name in values}

    def in_sample(self) -> dict[Unknown, float]:
        return self.by_unknown(self.values)

    def cross_validated(self, point: Mapping[str, Any]) -> dict[Unknown, float] | None:
        """The values fitted without the point's group: for a point outside the fit too when
        the fit held its group out (a point published.yaml marks ``fitted: false`` beside
        fitted ones, whose values the in-sample ones also learnt from), else the in-sample
        values, already out of sample for it. None: the fit has no fold for a fitted point's
        group."""
        group = source_group(point)
        if group in self.folds:
            return self.by_unknown(self.folds[group])
        return self.in_sample() if str(point["id"]) not in self.points else None

    def to_mapping(self) -> dict[str, Any]:
        return {
            "version": 1,
            **self.meta,
            "points": list(self.points),
            "values": {u.name: {"value": _num(self.values[u.name]), "sigma": _num(self.sigma.get(u.name, math.nan)),
                                "prior": list(u.prior), "unit": u.unit, "at_bound": u.name in self.at_bound,
                                **({"pulled_by": dict(self.pulls[u.name])} if u.name in self.pulls else {})}
                       for u in self.unknowns},
            "folds": {g: {k: _num(v) for k, v in vals.items()} for g, vals in self.folds.items()},
        }


def _num(x: float) -> float | None:
    return None if not math.isfinite(x) else float(f"{x:.6g}")


def calibrate(points: list[Mapping[str, Any]], unknowns: list[Unknown], *, decode_tokens: int = 64,
              max_evals: int = 200, cross_validate: bool = True, made_by: str = "sim calibrate",
              cv_max_evals: int | None = None, loss: str = "linear", workers: int = 1,
              start: Mapping[str, float] | None = None, cv_start: str = "centre",
              progress: Callable[[str, int, float], None] | None = None,
              evaluator: Evaluator | None = None, cv_jacobian: str = "difference",
              not_fitted: list[str] | None = None) -> tuple[Calibration, FitResult]:
    """Fit on every point, then refit once per source group held out (leave-one-group-out).

    ``not_fitted``: the ids of points the selection left out because published.yaml marks them
    ``fitted: false``; the file lists them so a reader sees what the fit did not see.

    ``start`` (names to values) is where the full fit's search begins (the priors' centres
    otherwise). A fold works from the full fit's sensitivities (which unknowns move which
    points):

    - an unknown the held-out group does not move keeps the full fit's value, which no point
      of the group informed;
    - an unknown the group moves is refitted on the kept points, from its prior's centre (a
      fold started at the full fit's value would keep, wherever the kept points leave it
      free, what the held-out group taught it);
    - one the group moves but no kept point does stays at its prior's centre, as do those
      that move the fewest kept points if the half-rule would be broken
      (``meta.fold_notes`` names them).

    Holding the rest fixed is the approximation: they were fitted beside values the group
    informed, a second-order effect.

    ``cv_start`` ``both`` refits each fold a second time from the full fit's values and keeps
    that solution only if it lowers the kept points' own cost by more than
    ``WARM_FOLD_MARGIN``: a local search from the centres can stall on the plateaus of integer
    unknowns (the port's readers and window) in a basin the kept points themselves rank worse,
    and then the held-out error measures the search, not the prediction. The kept points decide;
    what can still leak is where the second solution sits along directions they leave nearly
    flat, so ``meta.fold_starts`` names the start each fold kept and ``meta.fold_costs`` the
    kept points' cost (scipy's: half the summed loss) each start reached. ``evaluator``: the
    one to run the predictions on (the caller's, to read afterwards what each point cost), else
    one of ``workers`` processes for this call. ``cv_jacobian``: how a fold's search updates its
    Jacobian (:data:`~sim.calibrate.fit.JACOBIANS`; the full fit always measures each one by
    differences, since its values and their uncertainties are what the calibration reports).
    Returns the calibration and the full fit.
    """
    check_fit(points, unknowns)
    if cv_start not in CV_STARTS:
        raise SimError(f"must be one of {', '.join(CV_STARTS)}, got {cv_start!r}", field="--cv-start")
    if cv_jacobian not in JACOBIANS:  # before the full fit's minutes, not at the first fold
        raise SimError(f"must be one of {', '.join(JACOBIANS)}, got {cv_jacobian!r}", field="--cv-jacobian")
    own = Evaluator(decode_tokens, workers=workers) if evaluator is None else contextlib.nullcontext(evaluator)
    with own as ev:  # predictions shared by the full fit and its folds
        full = fit(points, unknowns, decode_tokens=decode_tokens, max_evals=max_evals, evaluator=ev, loss=loss,
                   start=start, progress=(lambda n, c: progress("all points", n, c)) if progress else None)

        def moves(p: Mapping[str, Any], u: Unknown) -> bool:
            return full.sensitivity.get(str(p["id"]), {}).get(u.name, 0.0) > SENSITIVE

        folds: dict[str, dict[str, float]] = {}
        notes: dict[str, str] = {}
        starts: dict[str, str] = {}  # group -> the start whose solution the fold kept
        costs: dict[str, dict[str, float]] = {}  # group -> start -> the kept points' cost at its solution
        if cross_validate:
            for group in sorted({source_group(p) for p in points}):
                held = [p for p in points if source_group(p) == group]
                kept = [p for p in points if source_group(p) != group]
                informed = [u for u in unknowns if any(moves(p, u) for p in held)]
                reach = {u.name: sum(1 for p in kept if moves(p, u)) for u in informed}
                free = sorted((u for u in informed if reach[u.name] > 0), key=lambda u: -reach[u.name])
                while free and 2 * len(free) > len(kept):
                    free.pop()
                fixed = [u.name for u in informed if u not in free]
                if fixed:
                    notes[group] = (f"without {group}, {', '.join(fixed)} move{'s' if len(fixed) == 1 else ''} too "
                                    "few of the other points to refit: kept at the prior's centre")
                vals = {u.name: full.values[u.name] for u in unknowns if u not in informed}
                vals.update({u.name: u.midpoint for u in informed if u not in free})
                if free:
                    held_fixed = {u: vals[u.name] for u in unknowns if u not in free}

                    def refit(begin: Mapping[str, float] | None, label: str, g: str = group,
                              kept: list = kept, free: list = free, held_fixed: dict = held_fixed) -> FitResult:
                        return fit(kept, free, decode_tokens=decode_tokens, max_evals=cv_max_evals or max_evals,
                                   evaluator=ev, loss=loss, fixed=held_fixed, start=begin, sensitivity=False,
                                   jacobian_updates=cv_jacobian,
                                   progress=(lambda n, c: progress(f"without {g}{label}", n, c)) if progress else None)

                    sub = refit(None, "")
                    starts[group], costs[group] = "centre", {"centre": sub.cost}
                    if cv_start == "both":
                        warm = refit({u.name: full.values[u.name] for u in free}, ", from the full fit")
                        costs[group]["full fit"] = warm.cost
                        if warm.cost < (1 - WARM_FOLD_MARGIN) * sub.cost:
                            sub, starts[group] = warm, "full fit"
                    vals.update(sub.values)
                folds[group] = {u.name: vals[u.name] for u in unknowns}
    meta = {"made_by": made_by, "code_version": _code_version(), "date": today(),
            "decode_tokens": decode_tokens, "max_evals": max_evals,
            "cv_max_evals": cv_max_evals or max_evals, "loss": loss,
            # where the full fit began, when not at the priors' centres: the file alone reruns it
            **({"start": {u.name: _num(float(start[u.name])) for u in unknowns if u.name in start}} if start else {}),
            "evaluations": full.evaluations,
            **({"not_fitted": list(not_fitted)} if not_fitted else {}),
            "warnings": list(full.warnings), "fold_notes": notes,
            **({"cv_start": cv_start, "cv_jacobian": cv_jacobian, "fold_starts": starts,
                "fold_costs": {g: {k: _num(v) for k, v in c.items()} for g, c in costs.items()}}
               if cross_validate else {}),
            "residuals": {i: {"before": _num(full.initial_residuals[i]), "after": _num(full.residuals[i])}
                          for i in full.points}}
    cal = Calibration(unknowns, dict(full.values), dict(full.sigma), list(full.at_bound), list(full.points), folds,
                      meta, pulls=dict(full.pulls))
    return cal, full


def _code_version() -> str:
    import sim
    from sim.code_version import code_digest

    return f"{sim.__version__}+{code_digest()}"


def default_path() -> Path:
    return bundled_dir("validation") / DEFAULT_NAME


def load_calibration(ref: str | Path | None) -> Calibration | None:
    """``none`` -> None; None -> the bundled default; else a file `sim calibrate --out` wrote.

    A file is parsed once per version of it (its path, size and modification time) and each
    caller gets a copy: a sweep resolves every point's calibration, and parsing the YAML was
    nearly all of the ~70 ms a point took to check.
    """
    if isinstance(ref, str) and ref == NONE:
        return None
    path = default_path() if ref is None else Path(ref)
    label = BUNDLED_LABEL if ref is None else str(path)

    def parse() -> Calibration:
        raw = load_yaml_text(path.read_text(encoding="utf-8"), str(path)) if ref is None else load_yaml_file(path)
        return from_mapping(raw, label)

    version = file_version(path)
    if version is None:
        return parse()  # the reader's own one-line error
    return copy.deepcopy(kept(_LOADED, (version, label, registry_version()), parse, LOADED_CACHE))


def from_values(values: Mapping[str, float], source: str) -> Calibration:
    """A calibration of in-sample values alone (what a sweep point carries to its worker)."""
    registry = {u.name: u for u in load_unknowns()}
    unknowns = [registry[name] for name in values]
    return Calibration(unknowns, {k: float(v) for k, v in values.items()}, {}, [], [], {}, {}, source)


def from_mapping(raw: Mapping[str, Any], source: str) -> Calibration:
    if raw.get("version") != 1:
        raise SimError(f"expected version: 1, got {raw.get('version')!r}", source=source, field="version")
    registry = {u.name: u for u in load_unknowns()}
    values_raw = raw.get("values")
    if not isinstance(values_raw, Mapping) or not values_raw:
        raise SimError("expected a mapping of unknown names to fitted values", source=source, field="values")
    unknowns, values, sigma = [], {}, {}
    for name, entry in values_raw.items():
        if name not in registry:
            raise SimError(f"unknown {name!r} is not in the registry; known: {', '.join(registry)}",
                           source=source, field="values")
        u = registry[name]
        value = entry.get("value") if isinstance(entry, Mapping) else None
        if not isinstance(value, int | float) or isinstance(value, bool) or not (
                u.prior[0] <= value <= u.prior[1]):
            raise SimError(f"must be a number in the prior [{u.prior[0]:g}, {u.prior[1]:g}], got {value!r}",
                           source=source, field=f"values.{name}.value")
        unknowns.append(u)
        values[name] = float(value)
        s = entry.get("sigma")
        sigma[name] = float(s) if isinstance(s, int | float) else math.nan
    at_bound = [n for n, e in values_raw.items() if isinstance(e, Mapping) and e.get("at_bound")]
    pulls = {n: {str(i): float(s) for i, s in e["pulled_by"].items() if isinstance(s, int | float)}
             for n, e in values_raw.items() if isinstance(e, Mapping) and isinstance(e.get("pulled_by"), Mapping)}
    folds = {str(g): {str(k): float(v) for k, v in (vals or {}).items()}
             for g, vals in (raw.get("folds") or {}).items()}
    meta = {k: v for k, v in raw.items() if k not in ("version", "values", "folds", "points")}
    return Calibration(unknowns, values, sigma, at_bound, [str(p) for p in raw.get("points") or []], folds, meta,
                       source, pulls)
