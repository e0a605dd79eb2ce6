"""Generate 1,000 decode tokens of TurboSparse-Mixtral-47B and print time and peak memory.

Target (issue 4): under 5 s and under 1 GiB on this machine (32 layers, 8 experts, top-2,
14336 neurons per expert, with predicted sets). The baseline is a naive numpy generator in
the same process (independent Bernoulli draws for every routed expert's neurons, one
numpy call per pool, no persistence), timed on 100 tokens and scaled to 1,000.

    python benchmarks/trace_synth.py [--tokens 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import numpy as np

from sim.traces.params import SynthDims, load_preset
from sim.traces.synth import TraceSynthesizer, synthesize


def naive_baseline(gen: TraceSynthesizer, n_tokens: int) -> float:
    """Seconds for a per-pool numpy Bernoulli draw over the same routed experts."""
    rng = np.random.default_rng(0)
    p = gen.tables.p_by_id
    experts = gen.next_chunk(n_tokens).experts  # reuse real routing
    start = time.perf_counter()
    for t in range(n_tokens):
        for layer in range(p.shape[0]):
            for e in experts[t, layer]:
                np.flatnonzero(rng.random(p.shape[2], dtype=np.float32) < p[layer, e])
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    params = load_preset("turbosparse-mixtral-47b")
    dims = params.made_for or SynthDims(32, 14336, 4096, 8, 2)

    for _ in synthesize(params, SynthDims(2, 64, 8, 8, 2), 4, 0):  # compile the kernels first
        pass

    tracemalloc.start()
    start = time.perf_counter()
    gen = TraceSynthesizer(params, dims, args.seed)
    setup_s = time.perf_counter() - start
    n_ids = n_pred = 0
    for chunk in synthesize(params, dims, args.tokens, args.seed, synthesizer=gen):
        n_ids += chunk.ids.size
        n_pred += 0 if chunk.pred_ids is None else chunk.pred_ids.size
    total_s = time.perf_counter() - start
    _, peak_traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB

    base_tokens = min(100, args.tokens)
    base_s = naive_baseline(TraceSynthesizer(params, dims, args.seed), base_tokens) * args.tokens / base_tokens

    print(f"turbosparse-mixtral-47b: {args.tokens} decode tokens, {dims.n_layers} layers x {dims.n_experts} experts "
          f"(top-{dims.top_k}) x {dims.n_neurons} neurons, with predicted sets")
    print(f"  time            {total_s:6.2f} s  (setup {setup_s:.2f} s; target < 5 s)")
    print(f"  peak memory     {peak_traced / 2**20:6.0f} MiB traced by tracemalloc (numpy buffers), "
          f"{peak_rss / 2**20:.0f} MiB process peak RSS incl. interpreter and numba (target < 1024 MiB)")
    print(f"  output          {n_ids / 1e6:.1f} M active ids, {n_pred / 1e6:.1f} M predicted ids "
          f"(realised density {gen.realised_density().mean():.4f}, target {gen.target_density.mean():.4f})")
    print(f"  naive numpy i.i.d. baseline (no persistence, active sets only): {base_s:6.2f} s "
          f"-> generator is {base_s / total_s:.1f}x faster")


if __name__ == "__main__":
    main()
