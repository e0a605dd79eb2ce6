"""Decode tokens/s of the numpy core on SmolLM2-135M: dense and at 15% FFN density (CATS thresholds).

Run: python benchmarks/llama_decode.py [--tokens N]  (after `python -m sim.inference.fetch smollm2`).
Prints measured figures only; the tests never time anything.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.inference.llama import load_llama
from sim.inference.sparsify import calibrate

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    dec = load_llama()
    calib = dec.tok.encode((ROOT / "traces" / "corpus" / "tale_of_two_cities_ch1.txt").read_text("utf-8"))[:256]
    prompt = "It is a truth universally acknowledged, that"
    dec.generate(prompt, 2)  # warm-up (numba compiles the sparse kernel on first use)
    dense = dec.generate(prompt, args.tokens, stop_at_eos=False)
    sparse_fn = calibrate(dec.net, calib, 0.15)
    dec.generate(prompt, 2, active=sparse_fn)
    sparse = dec.generate(prompt, args.tokens, active=sparse_fn, stop_at_eos=False)
    print(f"smollm2-135m numpy decode, {args.tokens} tokens, 1 BLAS thread")
    print(f"  dense          {dense.tokens_per_s:7.2f} tokens/s  (density {dense.density:.3f})")
    print(f"  15% (CATS)     {sparse.tokens_per_s:7.2f} tokens/s  (density {sparse.density:.3f})")
    print(f"  sparse / dense {sparse.tokens_per_s / dense.tokens_per_s:7.2f}x")


if __name__ == "__main__":
    main()
