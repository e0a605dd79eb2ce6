"""Synthesise and write 1,000 TurboSparse-Mixtral-47B decode tokens: time, file size, peak memory.

Targets (issue 20, item 2): 1,000 tokens (32 layers, 8 experts top-2, 14336 neurons per
expert, with predicted sets) synthesised and written to a trace file in <= 5 s, the file
<= 100 MB, peak RSS <= 1 GiB (issue 4's figure for generation alone was < 5 s, < 1 GiB).

Figures printed, the baselines measured in the same process after the timed write:
- the write itself (``write_synthetic`` as ``sim trace synth`` calls it, format version 2):
  wall time, file size, and the process's peak RSS (interpreter and numba included);
- generation alone (the same tokens, nothing written): what writing adds on top;
- the version-1 writer on the first ``--v1-tokens`` tokens, scaled to the same count: how
  much faster and smaller version 2 is;
- a naive numpy generator (independent Bernoulli draws per routed expert's pool, no
  persistence, active sets only) on ``--v1-tokens`` tokens, scaled: issue 4's baseline.

    python benchmarks/trace_synth.py [--tokens 1000] [--seed 0] [--v1-tokens 100]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from sim.traces.format import save_trace
from sim.traces.params import SynthDims, load_preset
from sim.traces.synth import TraceSynthesizer, synthesize, write_synthetic

TARGET_S, TARGET_MB, TARGET_RSS_MIB = 5.0, 100.0, 1024.0


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
    ap.add_argument("--v1-tokens", type=int, default=100, help="tokens for the version-1 and naive baselines")
    args = ap.parse_args()
    params = load_preset("turbosparse-mixtral-47b")
    dims = params.made_for or SynthDims(32, 14336, 4096, 8, 2)

    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "small.npz"  # compile the generator and codec kernels first, untimed
        write_synthetic(small, params, SynthDims(2, 64, 8, 8, 2), 4, 0)
        save_trace(Path(tmp) / "small1.npz", *_meta_and_chunks(params, SynthDims(2, 64, 8, 8, 2), 4, 0), version=1)

        out = Path(tmp) / "mixtral.npz"
        start = time.perf_counter()
        _, gen = write_synthetic(out, params, dims, args.tokens, args.seed)
        write_s = time.perf_counter() - start
        size_mb = out.stat().st_size / 1e6
        peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB

        start = time.perf_counter()
        n_ids = n_pred = 0
        for chunk in synthesize(params, dims, args.tokens, args.seed):
            n_ids += chunk.ids.size
            n_pred += 0 if chunk.pred_ids is None else chunk.pred_ids.size
        gen_s = time.perf_counter() - start

        k = min(args.v1_tokens, args.tokens)
        v1 = Path(tmp) / "mixtral-v1.npz"
        start = time.perf_counter()
        save_trace(v1, *_meta_and_chunks(params, dims, k, args.seed), version=1)
        v1_s = (time.perf_counter() - start) * args.tokens / k
        v1_mb = v1.stat().st_size / 1e6 * args.tokens / k
    base_s = naive_baseline(TraceSynthesizer(params, dims, args.seed), k) * args.tokens / k

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print(f"turbosparse-mixtral-47b: {args.tokens} decode tokens, {dims.n_layers} layers x {dims.n_experts} experts "
          f"(top-{dims.top_k}) x {dims.n_neurons} neurons, with predicted sets; "
          f"{n_ids / 1e6:.1f} M active and {n_pred / 1e6:.1f} M predicted ids")
    print(f"  machine load average (1 min) {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores: absolute times inflate with it, ratios less")
    print(f"  synthesised and written  {write_s:7.2f} s    (target <= {TARGET_S:.0f} s: "
          f"{verdict(write_s <= TARGET_S)})")
    print(f"  file (format v2)         {size_mb:7.1f} MB   (target <= {TARGET_MB:.0f} MB: "
          f"{verdict(size_mb <= TARGET_MB)}), {size_mb * 1e3 / args.tokens:.1f} KB per token")
    print(f"  peak RSS                 {peak_rss_mib:7.0f} MiB  (target <= {TARGET_RSS_MIB:.0f} MiB: "
          f"{verdict(peak_rss_mib <= TARGET_RSS_MIB)}; interpreter and numba included)")
    print("same-process baselines:")
    print(f"  generation alone         {gen_s:7.2f} s    -> writing adds {write_s / gen_s - 1:+.0%}")
    print(f"  version-1 writer         {v1_s:7.2f} s, {v1_mb:6.1f} MB (from {k} tokens, scaled) -> version 2 is "
          f"{v1_s / write_s:.1f}x faster, {v1_mb / size_mb:.1f}x smaller")
    print(f"  naive numpy i.i.d. generator (no persistence, active sets only, {k} tokens scaled): {base_s:7.2f} s -> "
          f"the generator alone is {base_s / gen_s:.1f}x faster")
    print(f"  realised density {gen.realised_density().mean():.4f} (target {gen.target_density.mean():.4f})")


def _meta_and_chunks(params, dims: SynthDims, n_tokens: int, seed: int):
    gen = TraceSynthesizer(params, dims, seed)
    return gen.meta(n_tokens, 64), synthesize(gen.params, gen.dims, n_tokens, gen.seed, synthesizer=gen)


if __name__ == "__main__":
    main()
