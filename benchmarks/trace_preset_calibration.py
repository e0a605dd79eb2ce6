"""Check the calibrated trace presets against the published figures they were tuned to.

Prints, for the bundled presets at full model size:

- opt-6.7b: LLM in a Flash's sliding-window figures on the predicted sets (2.4% of the FFN
  loaded per token with k = 5, ~10% with no window, the k = 5 window holding ~24%).
- turbosparse-mixtral-47b: the miss rate of a neuron-level LRU cache holding 50% of all FFN
  neurons, replayed over the predicted sets (PowerInfer-2 §7: 3.5% mean, 18.9% P99).

The LRU replay is deliberately simple (numpy, one batch of accesses per token, the cache's
content is the ``capacity`` most recently used (layer, expert, neuron) keys) so that it can
serve as an independent check of the engine's cache later.

    python benchmarks/trace_preset_calibration.py [--tokens 1200] [--warmup 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable

import numpy as np

from sim.traces.format import TraceChunk
from sim.traces.params import load_preset
from sim.traces.stats import trace_stats
from sim.traces.synth import SynthDims, synth_trace, synthesize


def lru_replay(chunks: Iterable[TraceChunk], dims: SynthDims, n_tokens: int, capacity_fraction: float = 0.5,
               warmup: int = 200, predicted: bool = True) -> dict[str, float]:
    """Miss rates of a neuron-level LRU cache holding ``capacity_fraction`` of all FFN neurons."""
    n_l, n_e, n = dims.n_layers, dims.n_experts, dims.n_neurons
    capacity = int(capacity_fraction * n_l * n_e * n)
    last = np.full(n_l * n_e * n, -1, np.int64)
    per_time = np.zeros(n_tokens, np.int64)  # keys whose most recent access was token s
    per_token, per_token_layer = [], []
    rows_per_token = n_l * dims.top_k
    for ch in chunks:
        off = ch.pred_offsets if predicted else ch.offsets
        ids = ch.pred_ids if predicted else ch.ids
        assert off is not None and ids is not None
        experts = ch.experts.reshape(-1).astype(np.int64)
        rows = np.repeat(np.arange(off.size - 1), np.diff(off))
        layer = (rows // dims.top_k) % n_l
        keys_all = (layer * n_e + experts[rows]) * n + ids
        for i in range(ch.n_tokens):
            t = ch.start + i
            a, b = off[i * rows_per_token], off[(i + 1) * rows_per_token]
            keys, lay = keys_all[a:b], layer[a:b]
            newest_first = np.cumsum(per_time[:t][::-1])
            j = int(np.searchsorted(newest_first, capacity, side="right"))
            tau = t - j  # every key last used at >= tau is resident
            full = newest_first[j - 1] if j >= 1 else 0
            seen = last[keys]
            hit = (seen >= tau).astype(np.float64)
            if tau >= 1 and per_time[tau - 1] > 0:  # the boundary token is partly resident
                hit[seen == tau - 1] = (capacity - full) / per_time[tau - 1]
            miss = 1.0 - hit
            if t >= warmup:
                per_token.append(miss.sum() / max(keys.size, 1))
                ml = np.bincount(lay, weights=miss, minlength=n_l)
                al = np.bincount(lay, minlength=n_l)
                per_token_layer.extend((ml[al > 0] / al[al > 0]).tolist())
            old = seen[seen >= 0]
            per_time[:t] -= np.bincount(old, minlength=t)[:t]
            last[keys] = t
            per_time[t] = keys.size
    tok, tl = np.asarray(per_token), np.asarray(per_token_layer)
    return {"mean": float(tok.mean()), "p99_token": float(np.percentile(tok, 99)),
            "p99_token_layer": float(np.percentile(tl, 99))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1200)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    opt = load_preset("opt-6.7b")
    assert opt.made_for is not None
    t0 = time.perf_counter()
    st = trace_stats(synth_trace(opt, opt.made_for, 400, args.seed))["predicted"]
    print(f"opt-6.7b preset, 400 tokens at full size ({time.perf_counter() - t0:.1f} s), predicted sets:")
    for label, got, want in (("new per token, no window (k=0)", st["window_new_share"][0], 0.10),
                             ("new per token, window k=5", st["window_new_share"][5], 0.024),
                             ("window k=5 holds", st["window_union_share"][5], 0.24)):
        print(f"  {label:34s} {got * 100:6.2f}%   [FLASH] {want * 100:5.1f}%   ratio {got / want:5.2f}")

    mix = load_preset("turbosparse-mixtral-47b")
    assert mix.made_for is not None
    dims = mix.made_for
    t0 = time.perf_counter()
    for predicted in (True, False):
        res = lru_replay(synthesize(mix, dims, args.tokens, args.seed), dims, args.tokens, 0.5, args.warmup,
                         predicted)
        kind = "predicted" if predicted else "active"
        print(f"turbosparse-mixtral-47b, LRU over {kind} neurons, cache = 50% of FFN, "
              f"{args.tokens - args.warmup} tokens after {args.warmup} warm-up:")
        print(f"  miss rate mean {res['mean'] * 100:5.2f}% (PI2 3.5%, ratio {res['mean'] / 0.035:4.2f}); "
              f"P99 per token {res['p99_token'] * 100:5.2f}%, per token-layer {res['p99_token_layer'] * 100:5.2f}% "
              f"(PI2 P99 18.9%)")
    print(f"({time.perf_counter() - t0:.1f} s for the two replays)")


if __name__ == "__main__":
    main()
