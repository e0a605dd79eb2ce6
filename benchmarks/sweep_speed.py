"""Wall time of the Fig. 10-style sweep: 14 budgets x 3 strategies, 128 decode tokens each.

Target (issue 20, item 1; issue 7 asked 30 s): the 42 runs of ``examples/fig10_budgets.yaml``
(TurboSparse-Mixtral-47B on the OnePlus 12, budgets 7-19 GB, PowerInfer-2 / LLM in a Flash /
llama.cpp, DES, 128 decode tokens) finish in <= 15 s on 2 workers. The trace store
(``sim.traces.store``) starts empty (a folder of this run), so the sweep pays for making its
trace once; ``--warm-store`` runs the sweep a second time into a new results file with the
trace already stored.

Figures printed:
- wall time of the whole sweep (``run_sweep`` into a fresh results file: expansion,
  process start, every simulation, durable parts, compaction) and points per second;
- the serial baseline measured in the same run: the sum of the points' own simulation
  times (``wall_s`` of each row), and the parallel speed-up and efficiency against it;
- where the time goes per strategy (mean seconds per point), and the runner's overhead
  (wall time x workers minus simulation time, per point);
- ``--resume``: a second run of the same command, which must find every point done;
- the trace made once in this process (the work a point would redo without the store).

Run: ``python benchmarks/sweep_speed.py [--workers 2] [--decode-tokens 128] [--budgets 14]``.
Smaller ``--decode-tokens``/``--budgets`` give a quick check; the target applies to the
defaults.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml

from sim.explore.spec import spec_from_mapping
from sim.explore.sweep import run_sweep

SPEC = Path(__file__).resolve().parents[1] / "examples" / "fig10_budgets.yaml"
TARGET_S = 15.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--budgets", type=int, default=14, help="use the first N budgets of the spec")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--warm-store", action="store_true", help="also time the sweep with its trace already stored")
    args = ap.parse_args()

    raw = yaml.safe_load(SPEC.read_text())
    raw["base"]["decode_tokens"] = args.decode_tokens
    raw["grid"]["memory_budget"] = raw["grid"]["memory_budget"][: args.budgets]
    spec = spec_from_mapping(raw, str(SPEC))
    n_points = len(raw["grid"]["memory_budget"]) * len(raw["grid"]["system"])

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PHONESIM_TRACE_CACHE"] = str(Path(tmp) / "store")  # empty; the workers inherit it
        out = Path(tmp) / "fig10.parquet"
        t0 = time.perf_counter()
        report = run_sweep(spec, out, workers=args.workers, progress=args.progress)
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = run_sweep(spec, out, workers=args.workers, progress=False)
        resume = time.perf_counter() - t1
        warm = None
        if args.warm_store:
            t2 = time.perf_counter()
            run_sweep(spec, Path(tmp) / "fig10-warm.parquet", workers=args.workers, progress=False)
            warm = time.perf_counter() - t2
        trace_s = _trace_once(raw["base"], args.decode_tokens)

    df = report.results
    sim_s = float(df["wall_s"].sum())
    print(f"sweep: {n_points} points ({len(raw['grid']['memory_budget'])} budgets x 3 strategies), "
          f"{args.decode_tokens} decode tokens each, {args.workers} workers")
    print(f"  machine load average (1 min) {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores: absolute times inflate with it, ratios less")
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
    if warm is not None:
        print(f"  trace already stored {warm:8.1f} s   (the same sweep into a new results file)")
    print(f"  trace made once      {trace_s:8.1f} s   (generated and kept in one process; a point without the "
          f"store and the in-process copy would pay it again: x{n_points} = {trace_s * n_points:.0f} s)")


def _trace_once(base: dict, decode_tokens: int) -> float:
    """Seconds to generate and read the sweep's trace once, in this process (store off)."""
    from sim.engine.simulation import DEFAULT_PROFILE_TOKENS, GENERATED_CHUNK_TOKENS
    from sim.profiles.registry import load_model
    from sim.traces.params import SynthDims
    from sim.traces.synth import synth_trace

    model = load_model(base["model"])
    n = DEFAULT_PROFILE_TOKENS + 16 + decode_tokens
    t0 = time.perf_counter()
    for _ in synth_trace(model.name, SynthDims.from_model(model), n, 0, chunk_tokens=GENERATED_CHUNK_TOKENS).chunks():
        pass
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
