"""Remake the bundled default calibration and print how long it takes (issue 19's target: 15 minutes on 2 cores).

The default calibration (validation/calibration.yaml) records the command that made it
(``made_by``): its points, unknowns, run length, evaluation budget and the full fit's
start (``start``, when ``--start`` gave one) and where its folds search from
(``cv_start``). This reruns that fit, cross-validation folds included, times it, and
prints how far each value moved from the committed one in units of its uncertainty and
which folds kept another start, then where the time went: each stage's wall time (the full
fit, each fold) and each implementation's and the costliest points' share of the workers'
seconds. The baseline in the same process is one
evaluation of every point at the calibration's run length (what a fit without the
per-point memo would pay for every Jacobian column), so the ratio says how many
point-set evaluations the whole fit cost.

    python benchmarks/calibration_time.py
"""

from __future__ import annotations

import time

from sim.calibrate.calibration import calibrate, load_calibration
from sim.calibrate.evaluator import Evaluator, default_workers, predict
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
    cv_jacobian = str(committed.meta.get("cv_jacobian", "difference"))  # how the folds update their Jacobians
    start = committed.meta.get("start")  # the full fit's start, when `--start` gave one (else the priors' centres)
    workers = default_workers()
    t0 = time.perf_counter()
    for p in points:  # baseline: every point once, uncalibrated
        predict(p, {}, decode_tokens=decode_tokens)
    one_pass = time.perf_counter() - t0
    stages: dict[str, float] = {}  # the full fit, then each fold: wall seconds until its last evaluation
    t0 = time.perf_counter()

    def progress(label: str, n: int, cost: float) -> None:
        stages[label.split(",")[0]] = time.perf_counter() - t0  # a fold's second start counts with it

    with Evaluator(decode_tokens, workers=workers) as ev:
        cal, full = calibrate(points, committed.unknowns, decode_tokens=decode_tokens, max_evals=max_evals,
                              cv_max_evals=cv_max_evals, loss=loss, start=start, cv_start=cv_start,
                              cv_jacobian=cv_jacobian, progress=progress, evaluator=ev)
        spent = dict(ev.spent)
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
    ends = sorted(stages.items(), key=lambda kv: kv[1])
    starts = [0.0] + [end for _, end in ends[:-1]]
    print("wall time by stage: " + ", ".join(f"{label} {end - before:.0f} s"
                                             for (label, end), before in zip(ends, starts, strict=True)))
    busy = sum(s for _, s in spent.values())
    by_kind: dict[str, float] = {}
    for p in points:
        kind = str(p.get("implementation") or p["strategy"])
        by_kind[kind] = by_kind.get(kind, 0.0) + spent.get(str(p["id"]), (0, 0.0))[1]
    shares = ", ".join(f"{k} {v / busy:.0%}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    print(f"worker time {busy:.0f} s ({busy / (workers * elapsed):.0%} of {workers} workers' wall time); "
          f"by implementation: {shares}")
    for pid, (runs, seconds) in sorted(spent.items(), key=lambda kv: -kv[1][1])[:6]:
        print(f"  {pid}: {runs} runs, {seconds:.0f} s ({seconds / busy:.0%}; {seconds / runs:.2f} s a run)")
    print("within target" if elapsed <= TARGET_S else "OVER TARGET")


if __name__ == "__main__":
    main()
