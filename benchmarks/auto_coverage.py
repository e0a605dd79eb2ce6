"""How well ``--decode-tokens auto``'s interval covers, measured on the issue's 12 GB run.

Runs the default-length run (TurboSparse-Mixtral-47B, OnePlus 12, 12 GB, bundled calibration)
on ``--seeds`` seeds, each one replication's steady-state figure, then emulates the ``auto``
procedure (:func:`sim.engine.run_length.simulate_until_steady`'s stopping rule) on draws
from those figures, starting from several minimum replication counts: how often its 95%
interval holds the mean of all the figures, how many replications it runs, and, for groups
of five independent runs (seeds 0-4 of issue 21), how often every figure lies inside every
interval and how often the five intervals share a point (docs/steady_state.md).

    python benchmarks/auto_coverage.py [--seeds 120] [--budget 12GB] [--draws 4000]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from sim.commands.run import run_request
from sim.engine.config import RunConfig
from sim.engine.run_length import AUTO_HALF_WIDTH, AUTO_MAX_REPLICATIONS, replication_interval, replications_needed
from sim.engine.simulation import simulate


def emulate(stream, n0: int) -> tuple[float, float, float, int]:
    """(mean, lower, upper, replications) of the auto procedure on figures drawn from ``stream``."""
    figures: list[float] = []
    want = n0
    while True:
        while len(figures) < min(want, AUTO_MAX_REPLICATIONS):
            figures.append(next(stream))
        mean, lo, hi = replication_interval(figures)
        if (hi - lo) / 2 / mean <= AUTO_HALF_WIDTH or len(figures) >= AUTO_MAX_REPLICATIONS:
            return mean, lo, hi, len(figures)
        want = min(replications_needed(figures), 2 * len(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=120)
    parser.add_argument("--budget", default="12GB")
    parser.add_argument("--draws", type=int, default=4000)
    args = parser.parse_args()
    options = {k: v for k, v in RunConfig.defaults().items() if k not in ("knobs", "overrides")}
    request = run_request(plan=None, sets=[], calibration=None, **{**options, "memory_budget": args.budget})
    t0 = time.perf_counter()
    x = np.array([simulate(request.variant(seed=s)).summary["steady_state"]["decode_tokens_per_s"]
                  for s in range(args.seeds)])
    truth = x.mean()
    print(f"{args.seeds} seeds in {time.perf_counter() - t0:.0f} s: mean {truth:.4f}, spread "
          f"{x.std(ddof=1) / truth:.2%} (min {x.min():.3f}, max {x.max():.3f})")
    rng = np.random.default_rng(0)
    for n0 in (3, 5, 10):
        runs = [emulate(iter(rng.choice(x, 4 * AUTO_MAX_REPLICATIONS)), n0) for _ in range(args.draws)]
        groups = [runs[i:i + 5] for i in range(0, len(runs) - 4, 5)]
        inside = np.mean([all(b[1] <= a[0] <= b[2] for a, b in itertools.product(g, g)) for g in groups])
        common = np.mean([max(r[1] for r in g) <= min(r[2] for r in g) for g in groups])
        print(f"from {n0} replications: covers the mean {np.mean([lo <= truth <= hi for _, lo, hi, _ in runs]):.1%}, "
              f"{np.mean([n for *_, n in runs]):.1f} replications on average; five runs: every figure in every "
              f"interval {inside:.1%}, the intervals share a point {common:.1%}")


if __name__ == "__main__":
    main()
