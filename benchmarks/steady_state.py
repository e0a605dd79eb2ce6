"""Steady state of the issue's 12 GB run: the figure at ``--decode-tokens auto`` for several seeds.

Issue 21, item 1: TurboSparse-Mixtral-47B on the OnePlus 12 at 12 GB (bundled calibration)
gave different figures at different run lengths; at ``auto`` each seed's run should give the
same figure within its own 95% interval. Printed per seed: the replications ``auto`` ran,
all their tokens over all their time, the steady-state figure and interval, its half-width
and the wall time; then whether every seed's figure lies in every other seed's interval, and whether
the intervals share a common point. Also printed first, for comparison, single runs of
seed 0 at the default length and at 4 and 8 times it (their figure drifts with length:
docs/steady_state.md).

    python benchmarks/steady_state.py [--budget 12GB] [--seeds 0,1,2,3,4]
"""

from __future__ import annotations

import argparse
import time

from sim.commands.run import run_request
from sim.engine.config import DEFAULT_DECODE_TOKENS, RunConfig


def request(budget: str, seed: int, decode_tokens: int | str) -> object:
    options = {k: v for k, v in RunConfig.defaults().items() if k not in ("knobs", "overrides")}
    return run_request(plan=None, sets=[], calibration=None,
                       **{**options, "memory_budget": budget, "seed": seed, "decode_tokens": decode_tokens})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="12GB")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    for n in (DEFAULT_DECODE_TOKENS, 4 * DEFAULT_DECODE_TOKENS, 8 * DEFAULT_DECODE_TOKENS):
        s = request(args.budget, seeds[0], n).simulate().summary
        print(f"seed {seeds[0]}, {n} tokens: {s['decode_tokens_per_s']:.3f} tokens/s, steady "
              f"{s['steady_state']['decode_tokens_per_s']:.3f} CI {s['decode_tokens_per_s_ci']}")
    figures = {}
    for seed in seeds:
        t0 = time.perf_counter()
        s = request(args.budget, seed, "auto").simulate().summary
        wall = time.perf_counter() - t0
        steady, ci = s["steady_state"], s["decode_tokens_per_s_ci"]
        figures[seed] = (steady["decode_tokens_per_s"], ci)
        print(f"seed {seed}: auto {s['decode_tokens_auto']['replications']} replications, "
              f"all tokens {s['decode_tokens_per_s']:.3f}, "
              f"steady {steady['decode_tokens_per_s']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] half-width "
              f"{steady['half_width']:.2%}, {wall:.1f} s")
    inside = all(ci[0] <= x <= ci[1] for x, _ in figures.values() for _, ci in figures.values())
    common = max(ci[0] for _, ci in figures.values()) <= min(ci[1] for _, ci in figures.values())
    print(f"every seed's figure inside every seed's interval: {inside}; the intervals share a point: {common}")


if __name__ == "__main__":
    main()
