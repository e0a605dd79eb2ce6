"""Which numba kernels a fresh ``sim run`` compiles, and what each costs: where first-run time goes.

Issue 20, item 4 asks a first run (empty ``NUMBA_CACHE_DIR``) to finish in <= 15 s; this says
which kernels to shrink, split or replace. It runs ``sim <args>`` (default ``run
--decode-tokens 128``) in this process with an empty numba cache of its own and a numba
compile listener, without the background helper (``sim.kernel_warmup``), so every kernel of
the path compiles here, one after another, and is timed. Printed: each top-level kernel's
compile seconds (including the kernels it calls, listed under it), their sum, the command's
wall time, the same command again with every kernel cached (the baseline measured in this
process's run: the difference is what compiling costs) and the machine's load.

    python benchmarks/kernel_compile.py [run --decode-tokens 128]
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time

CHILD = "PHONESIM_KERNEL_COMPILE_CHILD"


def _child(argv: list[str]) -> None:
    """Run the command with a listener; print the compile events (depth, name, seconds) at exit."""
    import atexit

    from numba.core import event

    import sim.kernel_warmup

    sim.kernel_warmup.start = lambda config: None  # every kernel compiles in this process
    stack: list[float] = []
    done: list[tuple[int, str, float]] = []

    class _Listener(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            stack.append(time.perf_counter())

        def on_end(self, ev: event.Event) -> None:
            took = time.perf_counter() - stack.pop()
            func = getattr(ev.data.get("dispatcher"), "py_func", None)
            if getattr(func, "__module__", "").startswith("sim."):
                done.append((len(stack), f"{func.__module__}.{func.__name__}", took))

    def report() -> None:
        for depth, name, took in done:
            print(f"KERNEL {depth} {took:.3f} {name}", file=sys.__stderr__, flush=True)

    event.register("numba:compile", _Listener())
    atexit.register(report)
    from sim.cli import main

    sys.argv = ["sim", *argv]
    with contextlib.suppress(SystemExit):
        main()


def _timed(argv: list[str], numba_dir: str, store: str) -> tuple[float, list[tuple[int, str, float]]]:
    env = {**os.environ, "NUMBA_CACHE_DIR": numba_dir, "PHONESIM_TRACE_CACHE": store, CHILD: "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - t0
    events = []
    for line in proc.stderr.splitlines():
        if line.startswith("KERNEL "):
            _, depth, took, name = line.split(" ", 3)
            events.append((int(depth), name, float(took)))
    return wall, events


def main() -> None:
    argv = sys.argv[1:] or ["run", "--decode-tokens", "128"]
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        fresh_s, events = _timed(argv, f"{tmp}/numba", f"{tmp}/store")
        warm_s, _ = _timed(argv, f"{tmp}/numba", f"{tmp}/store2")  # kernels cached, trace made again
    top = [(name, took) for depth, name, took in events if depth == 0]
    total = sum(took for _, took in top)
    print(f"sim {' '.join(argv)}: kernels compiled on a fresh run, without the helper process "
          f"(load average {load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores)")
    for depth, name, took in events:
        print(f"  {'    ' * depth}{took:6.2f} s  {name}")
    print(f"  {len(top)} top-level kernels, {total:.1f} s compiling; slowest: "
          + ", ".join(f"{n.rsplit('.', 1)[1]} {t:.1f} s" for n, t in sorted(top, key=lambda x: -x[1])[:3]))
    print(f"  wall: fresh {fresh_s:.1f} s, warm (kernels cached) {warm_s:.1f} s (baseline): fresh is "
          f"{fresh_s / warm_s:.1f}x, compiling costs {fresh_s - warm_s:.1f} s here")


if __name__ == "__main__":
    if os.environ.get(CHILD):
        _child(sys.argv[1:])
    else:
        main()
