"""Engine speed: simulated decode tokens against a bare simpy loop, in one run.

Target (issue 20, after issue 6): the marginal DES cost of one more decode token of
TurboSparse-Mixtral-47B with powerinfer2 is <= 5,000 "simpy-timeout-equivalents", where one
equivalent is the wall time of one ``yield env.timeout(1)`` in a bare simpy loop of 1M
timeouts measured in the same process (so the ratio does not depend on the machine). The
marginal cost is measured as a 384-token run less a 128-token run on the same trace; the
average over a 128-token run (which also carries what a run pays once: the hot and NPU
sets, the cache's preload, the offline profile) is printed beside it.

Figures printed (each the best of ``--repeat`` runs):

- the bare loop: 1M timeouts;
- ``simulate()`` as ``sim run`` calls it (``sim run --decode-tokens 128`` defaults: the
  OnePlus 12, the device's usable DRAM, the bundled ``turbosparse-mixtral-47b`` preset
  generated on the fly), without the CLI's interpreter start-up and imports;
- the engine alone: the same run on a trace generated beforehand;
- the marginal cost: three times the decode tokens less the run above, per added token (the target);
- where the engine's time goes: policy kernel (``NeuronCache.cold_hits``, one call per token), the rest of the
  per-layer planning (NPU split, fired test, cluster counts), trace decoding, strategy
  set-up (hot and NPU sets), and the discrete-event part (simpy events plus the
  strategy's and machine's generator code), with simpy events per token.

Run: ``python benchmarks/engine_speed.py [--tokens 128] [--budget 19GB|--offload 0.5]
[--repeat 2] [--profile]``. ``--profile`` adds a cProfile listing of the engine-only run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections.abc import Callable
from typing import Any, ClassVar

import simpy

from sim.engine import neuron_cache, simulation, workload
from sim.engine.strategies import powerinfer2
from sim.profiles.registry import load_model
from sim.traces.format import Trace
from sim.traces.params import SynthDims, params_from_mapping, preset_names, resolve_params
from sim.traces.synth import synth_trace

MODEL = "turbosparse-mixtral-47b"
TIMEOUTS = 1_000_000
TARGET = 5_000  # issue 20: marginal DES cost per decode token, in bare-simpy-timeout equivalents
# Used only when the bundled preset is missing (older checkouts): same shape of statistics.
FALLBACK_PARAMS = {
    "name": "fallback-mixtral", "density": {"value": 0.15, "assumed": "benchmark fallback"},
    "propensity": {"dist": "logitnormal", "sigma": 2.0, "assumed": "benchmark fallback"},
    "persistence": {"value": 0.6, "assumed": "benchmark fallback"}, "routing": {"assumed": "benchmark fallback"},
    "predictor": {"recall": 0.95, "precision": 0.9, "assumed": "benchmark fallback"},
}


def bare_simpy(n: int = TIMEOUTS) -> float:
    env = simpy.Environment()

    def loop(env: simpy.Environment) -> Any:
        for _ in range(n):
            yield env.timeout(1)

    env.process(loop(env))
    t0 = time.perf_counter()
    env.run()
    return time.perf_counter() - t0


def best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


class Breakdown:
    """Wraps engine functions with timers (adds a little overhead of its own)."""

    TARGETS: ClassVar[list[tuple[Any, str, str]]] = [
        (neuron_cache.NeuronCache, "cold_hits", "cache policy (NeuronCache.cold_hits)"),
        (powerinfer2.PowerInfer2, "_token_plan", "per-layer planning, all"),
        (workload, "_token_work", "trace decoding (per token)"),
        (powerinfer2.PowerInfer2, "__init__", "strategy set-up (hot and NPU sets)"),
        (simulation, "popularity", "offline popularity profile"),
    ]

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.events = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Breakdown:
        for owner, name, label in self.TARGETS:
            original = getattr(owner, name)
            self._saved.append((owner, name, original))
            setattr(owner, name, self._timed(original, label))
        step = simpy.Environment.step
        self._saved.append((simpy.Environment, "step", step))

        def counting(env: simpy.Environment) -> None:
            self.events += 1
            step(env)

        simpy.Environment.step = counting  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)

    def _timed(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t0

        return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128, help="decode tokens to simulate")
    ap.add_argument("--warmup", type=int, default=16, help="warm-up tokens (sim run's default)")
    ap.add_argument("--budget", default=None, help="memory budget (default: the device's usable DRAM)")
    ap.add_argument("--offload", type=float, default=None, help="fraction of the FFN left on flash instead")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="print a cProfile listing of the engine-only run")
    args = ap.parse_args()

    model = load_model(MODEL)
    have_preset = MODEL in preset_names()
    params = resolve_params(MODEL) if have_preset else params_from_mapping(FALLBACK_PARAMS, "<fallback>")
    # As `sim run` on a preset: the trace's first DEFAULT_PROFILE_TOKENS tokens are the offline
    # profile, then the warm-up and decode tokens (a given trace would otherwise be profiled on
    # its decoded tokens: an oracle profile, and a counting pass that grows with the run).
    profile = simulation.DEFAULT_PROFILE_TOKENS
    n_trace = profile + args.warmup + args.tokens
    kw = dict(memory_budget=args.budget, offload=args.offload, decode_tokens=args.tokens,
              warmup_tokens=args.warmup, profile_tokens=profile)

    def run(trace: Any, **changes: Any) -> tuple[float, simulation.SimResult]:
        t0 = time.perf_counter()
        result = simulation.simulate("oneplus-12", model, "powerinfer2", trace=trace, **{**kw, **changes})
        return time.perf_counter() - t0, result

    # Warm numba's on-disk caches and the profile loaders once, untimed.
    run(synth_trace(params, SynthDims.from_model(model), profile + args.warmup + 2, seed=1), decode_tokens=2)

    bare = best(bare_simpy, args.repeat)
    t0 = time.perf_counter()
    # One trace serves every engine-only run: the 128-token runs decode its first tokens, the
    # marginal cost's long run all of them.
    n_long = n_trace + 2 * args.tokens
    trace: Trace = synth_trace(params, SynthDims.from_model(model), n_long, seed=0).materialise()
    synth_s = time.perf_counter() - t0
    # As `sim run` does it: the preset's trace generated inside simulate() (the process keeps
    # generated traces for later runs, so that store is emptied before every repeat).
    def fresh_run() -> float:
        simulation._GENERATED.clear()
        return run(None if have_preset else synth_trace(params, SynthDims.from_model(model), n_trace))[0]

    end_to_end = min(fresh_run() for _ in range(args.repeat))
    engine_runs = [run(trace) for _ in range(args.repeat)]
    engine, result = min(engine_runs, key=lambda r: r[0])
    # The marginal cost: a run three times as long, less the run above, on the same trace; what
    # each run pays once (the hot set, the NPU set, the cache's preload) cancels, and the
    # difference spans twice the run's tokens, so the machine's noise weighs half as much per token.
    long_engine = min(run(trace, decode_tokens=3 * args.tokens)[0] for _ in range(args.repeat))
    marginal = (long_engine - engine) / (2 * args.tokens)

    per_timeout = bare / TIMEOUTS
    print(f"model {MODEL}, powerinfer2 on oneplus-12, {args.tokens} decode tokens (+{args.warmup} warm-up), "
          f"budget {args.budget or ('offload ' + str(args.offload) if args.offload is not None else 'usable DRAM')}; "
          f"trace: {'bundled preset' if have_preset else 'fallback parameters'}")
    print(f"simulated decode: {result.summary['decode_tokens_per_s']:.3f} tokens/s, "
          f"miss ratio {result.summary['cache_miss_ratio_mean']:.4f}")
    print(f"bare simpy loop, {TIMEOUTS:,} timeouts:        {bare:8.3f} s ({per_timeout * 1e6:.3f} us per timeout)")
    print(f"trace generation ({n_long} tokens):            {synth_s:8.3f} s")
    timings = (("simulate() incl. trace generation", end_to_end), ("engine alone (trace in memory)", engine))
    for label, seconds in timings:
        ratio = seconds / args.tokens / per_timeout
        print(f"{label:38s} {seconds:8.3f} s -> {ratio:9,.0f} simpy-timeout-equivalents per simulated token")
    ratio = marginal / per_timeout
    met = "met" if ratio <= TARGET else "NOT met"
    print(f"{'marginal DES cost (engine, one more token)':38s} {marginal * 1e3:6.2f} ms -> {ratio:9,.0f} "
          f"simpy-timeout-equivalents per decode token (target <= {TARGET:,}: {met}; "
          f"{3 * args.tokens} against {args.tokens} tokens)")

    with Breakdown() as bd:
        t0 = time.perf_counter()
        simulation.simulate("oneplus-12", model, "powerinfer2", trace=trace, **kw)
        total = time.perf_counter() - t0
    planning = bd.seconds.get("per-layer planning, all", 0.0)
    cache = bd.seconds.get("cache policy (NeuronCache.cold_hits)", 0.0)
    rows = {
        "cache policy (NeuronCache.cold_hits)": cache,
        "per-layer planning besides the cache": planning - cache,
        "trace decoding (per token)": bd.seconds.get("trace decoding (per token)", 0.0),
        "strategy set-up (hot and NPU sets)": bd.seconds.get("strategy set-up (hot and NPU sets)", 0.0),
        "offline popularity profile": bd.seconds.get("offline popularity profile", 0.0),
    }
    rows["discrete-event part and the rest"] = total - sum(rows.values())
    print(f"\nwhere the engine's time goes ({total:.3f} s with timers; {bd.events / args.tokens:,.0f} simpy events "
          "per token):")
    for label, seconds in rows.items():
        print(f"  {label:40s} {seconds:7.3f} s  {seconds / total:5.1%}  "
              f"{seconds / args.tokens / per_timeout:9,.0f} timeout-eq/token")

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        simulation.simulate("oneplus-12", model, "powerinfer2", trace=trace, **kw)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue())


if __name__ == "__main__":
    main()
