"""Wall time of issue 21's default runs: `sim run --uncertainty` (target <= 2 min on 2 cores) and
`sim sensitivity` (target <= 5 min), each on the default configuration (OnePlus 12,
TurboSparse-Mixtral-47B, powerinfer2, 128 decode tokens), against a plain `sim run` of the
same configuration in the same process as the baseline.

    python benchmarks/trust_timing.py [--budget 12GB]
"""

from __future__ import annotations

import argparse
import time

from sim.cli import main as sim


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    assert sim(argv) == 0, argv
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default=None)
    args = parser.parse_args()
    budget = ["--memory-budget", args.budget] if args.budget else []
    base = timed(["run", *budget, "--json"])
    unc = timed(["run", *budget, "--uncertainty", "--json"])
    sens = timed(["sensitivity", *budget, "--json"])
    print(f"sim run: {base:.1f} s; --uncertainty: {unc:.1f} s ({unc / base:.1f}x, target 120 s); "
          f"sim sensitivity: {sens:.1f} s ({sens / base:.1f}x, target 300 s)")


if __name__ == "__main__":
    main()
