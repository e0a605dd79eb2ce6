"""A fresh install's first ``sim run``: numba compiles its kernels; how long, and does it say so.

Target (issue 20, item 4): with ``NUMBA_CACHE_DIR`` pointing at an empty folder, ``sim run``
prints its result in <= 15 s, and one line on stderr says that kernels are compiling.

Each figure is a separate ``sim run`` process (``python -m sim run``, the console script's
path, with ``--decode-tokens`` as given), timed from start to exit:

- fresh: an empty numba cache and an empty trace store (a new install), the target's case;
- fresh kernels, trace stored: another empty numba cache, the trace already in the store
  (kernels invalidated by an update, a trace made before);
- warm: the same command again, everything it needs cached: the baseline measured in the same
  run (fresh / warm is what compiling costs on this machine, whatever its load).

    python benchmarks/first_run.py [--decode-tokens 128]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim.compile_notice import HEADER

TARGET_S = 15.0


def run(argv: list[str], numba_dir: Path, store: Path) -> tuple[float, str, str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(numba_dir), "PHONESIM_TRACE_CACHE": str(store)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sim", *argv], capture_output=True, text=True, env=env, check=True)
    return time.perf_counter() - t0, proc.stdout, proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode-tokens", type=int, default=128)
    args = ap.parse_args()
    argv = ["run", "--decode-tokens", str(args.decode_tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        numba_dir, store, numba_dir2 = Path(tmp) / "numba", Path(tmp) / "store", Path(tmp) / "numba2"
        fresh_s, out, err = run(argv, numba_dir, store)
        again_s, _, err_again = run(argv, numba_dir2, store)  # new kernels, trace already stored
        warm_s, _, err_warm = run(argv, numba_dir2, store)  # everything this path needs is cached now
    notice = next((line for line in err.splitlines() if line.startswith(HEADER)), None)
    result = next((line for line in out.splitlines() if "decode_tokens_per_s" in line), "").strip()
    print(f"sim run --decode-tokens {args.decode_tokens} (OnePlus 12, TurboSparse-Mixtral-47B, powerinfer2)")
    print(f"  fresh (empty numba cache and trace store) {fresh_s:6.1f} s  (target <= {TARGET_S:.0f} s: "
          f"{'met' if fresh_s <= TARGET_S else 'NOT met'})")
    print(f"  fresh kernels, trace already stored       {again_s:6.1f} s")
    print(f"  warm (kernels and trace cached)           {warm_s:6.1f} s  (baseline: fresh is {fresh_s / warm_s:.1f}x, "
          f"compiling costs {fresh_s - warm_s:.1f} s here)")
    print(f"  compile notice shown: {'yes' if notice else 'NO'}{'' if notice is None else ': ' + notice.strip()}")
    print(f"  notice with the trace stored: {'yes' if HEADER in err_again else 'NO'}; "
          f"on the warm run: {'none (as it should)' if HEADER not in err_warm else 'SHOWN (unexpected)'}")
    print(f"  result: {result}")
    print(f"  machine load average (1 min) {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores: absolute times inflate with it, ratios less")


if __name__ == "__main__":
    main()
