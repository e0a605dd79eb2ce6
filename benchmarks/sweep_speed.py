"""Wall time of the Fig. 10-style sweep: 14 budgets x 3 strategies, 128 decode tokens each.

Target (issue 7): the 42 runs of ``examples/fig10_budgets.yaml`` (TurboSparse-Mixtral-47B
on the OnePlus 12, budgets 7-19 GB, PowerInfer-2 / LLM in a Flash / llama.cpp, DES,
128 decode tokens) finish in <= 30 s on 2 workers.

Figures printed:
- wall time of the whole sweep (``run_sweep`` into a fresh results file: expansion,
  process start, every simulation, durable parts, compaction) and points per second;
- the serial baseline measured in the same run: the sum of the points' own simulation
  times (``wall_s`` of each row), and the parallel speed-up and efficiency against it;
- where the time goes per strategy (mean seconds per point), and the runner's overhead
  (wall time x workers minus simulation time, per point);
- ``--resume``: a second run of the same command, which must find every point done.

Run: ``python benchmarks/sweep_speed.py [--workers 2] [--decode-tokens 128] [--budgets 14]``.
Smaller ``--decode-tokens``/``--budgets`` give a quick check; the target applies to the
defaults.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from sim.explore.spec import spec_from_mapping
from sim.explore.sweep import run_sweep

SPEC = Path(__file__).resolve().parents[1] / "examples" / "fig10_budgets.yaml"
TARGET_S = 30.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--budgets", type=int, default=14, help="use the first N budgets of the spec")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()

    raw = yaml.safe_load(SPEC.read_text())
    raw["base"]["decode_tokens"] = args.decode_tokens
    raw["grid"]["memory_budget"] = raw["grid"]["memory_budget"][: args.budgets]
    spec = spec_from_mapping(raw, str(SPEC))
    n_points = len(raw["grid"]["memory_budget"]) * len(raw["grid"]["strategy"])

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fig10.parquet"
        t0 = time.perf_counter()
        report = run_sweep(spec, out, workers=args.workers, progress=args.progress)
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = run_sweep(spec, out, workers=args.workers, progress=False)
        resume = time.perf_counter() - t1

    df = report.results
    sim_s = float(df["wall_s"].sum())
    print(f"sweep: {n_points} points ({len(raw['grid']['memory_budget'])} budgets x 3 strategies), "
          f"{args.decode_tokens} decode tokens each, {args.workers} workers")
    print(f"  wall time            {wall:8.1f} s   (target <= {TARGET_S:.0f} s: "
          f"{'met' if wall <= TARGET_S else 'NOT met'})")
    print(f"  points per second    {n_points / wall:8.2f}")
    print(f"  failed points        {report.failed:8d}" + (f"   first: {report.first_error}" if report.failed else ""))
    print(f"  serial baseline      {sim_s:8.1f} s   (sum of per-point simulation times, same run)")
    print(f"  speed-up vs serial   {sim_s / wall:8.2f} x  (parallel efficiency "
          f"{sim_s / wall / args.workers:.0%} of {args.workers} workers)")
    print(f"  runner overhead      {(wall * args.workers - sim_s) / n_points:8.3f} s per point "
          "(process start, scheduling, storage; trace generation counts in the points' own times)")
    for strategy, grp in df.groupby("strategy", sort=False):
        print(f"  {strategy:<14} mean {grp['wall_s'].mean():6.2f} s per point, "
              f"decode {grp['decode_tokens_per_s'].min():.2f}-{grp['decode_tokens_per_s'].max():.2f} tokens/s")
    print(f"  resume (all done)    {resume:8.2f} s   ({again.skipped} of {again.total} points skipped, "
          f"{again.ran} run)")


if __name__ == "__main__":
    main()
