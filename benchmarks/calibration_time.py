"""Remake the bundled default calibration and print how long it takes (issue 19's target: 15 minutes on 2 cores).

The default calibration (validation/calibration.yaml) records the command that made it
(``made_by``): its points, unknowns, run length, evaluation budget and the full fit's
start (``start``, when ``--start`` gave one) and where its folds search from
(``cv_start``). This reruns that fit, cross-validation folds included, times it, and
prints how far each value moved from the committed one in units of its uncertainty and
which folds kept another start. The baseline in the same process is one
evaluation of every point at the calibration's run length (what a fit without the
per-point memo would pay for every Jacobian column), so the ratio says how many
point-set evaluations the whole fit cost.

    python benchmarks/calibration_time.py
"""

from __future__ import annotations

import time

from sim.calibrate.calibration import calibrate, load_calibration
from sim.calibrate.evaluator import default_workers, predict
from sim.validation import load_points

TARGET_S = 15 * 60


def main() -> None:
    committed = load_calibration(None)
    assert committed is not None
    points = [p for p in load_points() if str(p["id"]) in committed.points]
    decode_tokens = int(committed.meta.get("decode_tokens", 32))
    max_evals = int(committed.meta.get("max_evals", 4))
    cv_max_evals = int(committed.meta.get("cv_max_evals", max_evals))
    loss = str(committed.meta.get("loss", "linear"))
    cv_start = str(committed.meta.get("cv_start", "centre"))  # where the folds search from
    start = committed.meta.get("start")  # the full fit's start, when `--start` gave one (else the priors' centres)
    workers = default_workers()
    t0 = time.perf_counter()
    for p in points:  # baseline: every point once, uncalibrated
        predict(p, {}, decode_tokens=decode_tokens)
    one_pass = time.perf_counter() - t0
    t0 = time.perf_counter()
    cal, full = calibrate(points, committed.unknowns, decode_tokens=decode_tokens, max_evals=max_evals,
                          cv_max_evals=cv_max_evals, loss=loss, workers=workers, start=start, cv_start=cv_start)
    elapsed = time.perf_counter() - t0
    print(f"default calibration ({workers} worker processes, {decode_tokens} decode tokens, loss {loss}): "
          f"{elapsed:.0f} s ({elapsed / 60:.1f} min; target {TARGET_S / 60:.0f} min), "
          f"{full.evaluations} evaluations of the full fit, {len(cal.folds)} cross-validation folds")
    print(f"one pass over the {len(points)} points: {one_pass:.1f} s; the calibration cost "
          f"{elapsed / one_pass:.0f} such passes")
    for name, value in committed.values.items():
        sigma = committed.sigma.get(name) or float("nan")
        moved = (cal.values[name] - value) / sigma if sigma == sigma and sigma > 0 else float("nan")
        print(f"  {name}: committed {value:.4g} +- {sigma:.2g}, refitted {cal.values[name]:.4g} ({moved:+.2f} sigma)")
    kept = committed.meta.get("fold_starts") or {}
    changed = {g: s for g, s in (cal.meta.get("fold_starts") or {}).items() if kept.get(g, s) != s}
    print(f"folds' starts (--cv-start {cv_start}): " + (", ".join(f"{g} now {s}" for g, s in changed.items())
                                                    if changed else "as committed"))
    print("within target" if elapsed <= TARGET_S else "OVER TARGET")


if __name__ == "__main__":
    main()
