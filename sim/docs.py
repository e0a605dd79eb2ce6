"""Regenerate the figures the README shows: ``python -m sim.docs [--out docs] [--small]``.

The committed PNGs under ``docs/`` are whatever this module draws from the current code
and profiles, so after a calibration change one command brings them up to date:

- ``tokens_vs_budget.png``: TurboSparse-Mixtral-47B on the OnePlus 12, decode tokens/s
  against the DRAM budget for PowerInfer-2, LLM in a Flash and llama.cpp, with the
  published PowerInfer-2 points of ``validation/published.yaml`` overlaid;
- ``latency_breakdown.png``: where a decode token's time goes in those runs;
- ``gantt.png``: the simulated timeline of one PowerInfer-2 decode token.

``--small`` (or ``PHONESIM_SMALL=1``) runs a few tokens at a few budgets: the same
figures, coarser, in seconds (what the test of this module uses).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import sim
from sim.studies import budget_sweep, small_mode

DEVICE = "oneplus-12"
MODEL = "turbosparse-mixtral-47b"
GANTT_BUDGET = "12GB"
FIGURES = ("tokens_vs_budget.png", "latency_breakdown.png", "gantt.png")


def _sizes(small: bool) -> dict[str, object]:
    if small:
        return {"budgets": ["7GB", "19GB"], "strategies": ["powerinfer2", "llm-in-flash"], "decode_tokens": 2,
                "warmup_tokens": 2, "breakdown_budgets": ["7GB", "19GB"]}
    return {"budgets": ["7GB", "9GB", "11GB", "13GB", "15GB", "17GB", "19GB"],
            "strategies": ["powerinfer2", "llm-in-flash", "llamacpp"], "decode_tokens": 32, "warmup_tokens": 16,
            "breakdown_budgets": ["7GB", "13GB", "19GB"]}


def make_docs(out_dir: str | Path = "docs", *, small: bool | None = None, seed: int = 0) -> list[Path]:
    """Run the studies and write :data:`FIGURES` into ``out_dir``; returns the paths."""
    from sim.engine.simulation import simulate
    from sim.plots import plot_gantt, plot_latency_breakdown, plot_tokens_vs_budget, save_figure
    from sim.validation import published_frame

    small = small_mode() if small is None else small
    size = _sizes(small)
    out = Path(out_dir)
    run_opts = {"decode_tokens": size["decode_tokens"], "warmup_tokens": size["warmup_tokens"], "seed": seed}
    how = (f"phonesim {sim.__version__}, `python -m sim.docs{' --small' if small else ''}`: "
           f"{size['decode_tokens']} decode tokens after {size['warmup_tokens']} warm-up, seed {seed}")
    runs, tokens = budget_sweep(size["budgets"], size["strategies"], device=DEVICE, model=MODEL, **run_opts)
    published = published_frame(device=DEVICE, model=MODEL)
    paths = []
    ax = plot_tokens_vs_budget(runs, published, caption=f"Simulated: {how}. Published: "
                               f"{'; '.join(dict.fromkeys(published['source']))} (PowerInfer-2 v3).")
    paths.append(save_figure(ax.figure, out / FIGURES[0], dpi=110))

    budgets = set(size["breakdown_budgets"])
    shown = tokens[tokens["label"].str.split("\n").str[1].isin(budgets)]
    ax = plot_latency_breakdown(shown, xlabel="strategy, DRAM budget",
                                title=f"{MODEL} on {DEVICE}: where a decode token's time goes",
                                caption=f"Simulated: {how}. Mean over decode tokens.")
    paths.append(save_figure(ax.figure, out / FIGURES[1], dpi=110))

    result = simulate(DEVICE, MODEL, "powerinfer2", memory_budget=GANTT_BUDGET, timeline=True,
                      **{**run_opts, "decode_tokens": 2})
    ax = plot_gantt(result.spans, first_token=1, n_tokens=1,
                    title=f"PowerInfer-2, {MODEL} on {DEVICE} at {GANTT_BUDGET}: one decode token",
                    caption=f"Simulated: phonesim {sim.__version__}, discrete-event timeline (`sim run --gantt`), "
                            f"token 1 after {size['warmup_tokens']} warm-up tokens, seed {seed}.")
    paths.append(save_figure(ax.figure, out / FIGURES[2], dpi=100))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.docs", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs", help="folder for the PNGs (default: docs)")
    parser.add_argument("--small", action="store_true", help="few tokens and budgets (also PHONESIM_SMALL=1)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    paths = make_docs(args.out, small=args.small or small_mode())
    for p in paths:
        print(f"wrote {p} ({p.stat().st_size / 1e3:.0f} KB)")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
