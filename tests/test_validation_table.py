"""The published points the simulator reproduces, held at their tolerance.

Runs the whole table of ``sim/data/validation/published.yaml`` once (as ``sim validate
--decode-tokens 128`` does, about 25 s) and requires every point in ``HELD`` to be within
its tolerance. The points not held are listed in ``KNOWN_OFF`` with what is known about
why; a point that comes within tolerance there is reported so it can move to ``HELD``.
"""

from __future__ import annotations

import math
import warnings

from sim import validation

HELD = {
    # [PI2] Fig. 10, §7.2.1 and §7.3: TurboSparse-Mixtral-47B on the OnePlus 12
    "pi2-mixtral-19gb", "pi2-mixtral-offload50", "pi2-mixtral-miss-mean", "pi2-mixtral-miss-p99",
    # [PI2] §7 memory breakdown at a 7 GB budget
    "pi2-mixtral-7gb-mem-nonffn", "pi2-mixtral-7gb-mem-predictors", "pi2-mixtral-7gb-mem-scales",
    "pi2-mixtral-7gb-mem-cache",
    # [FLASH] Tables 2-3: the OPT-6.7B I/O ladder on the M1 Max
    "flash-opt-io-naive", "flash-opt-io-hybrid", "flash-opt-io-predictor", "flash-opt-io-window",
    "flash-opt-io-bundling", "flash-opt-io-all",
    # [PI2] §2.3 calibration inputs, reproduced by the runs they calibrate
    "pi2-prefill-npu-7b", "pi2-prefill-cpu-7b", "pi2-prefill-gpu-7b",
    # llama.cpp's dense decode in memory: bandwidth-bound at [PI2] §2.3's 43.9 GB/s CPU figure
    "llamacpp-ts-mistral-inmem",
}

KNOWN_OFF = {
    "pi2-mixtral-7gb": "0.73 vs 2.13: ~1.2 GB/token of 4 KiB reads; 2.13 tokens/s at ~1 GB/s needs <= 0.5 GB/token, "
                       "i.e. a 0.4 GB cache hitting ~50% of requests; the preset's skew gives 4%",
    "pi2-ts-mistral-inmem": "+29%: dense parts stream at the CPU's 43.9 GB/s; the sparse path (sparse GEMV over "
                            "gathered rows, NPU hot half, per-layer sync) has no microbenchmark and runs too fast",
    "pi2-ts-mistral-offload50": "7B presets reuse Mixtral's locality statistics (assumed)",
    "pi2-bamboo-offload50": "7B presets reuse Mixtral's locality statistics (assumed)",
    "flash-bamboo-offload50": "the window keeps almost every neuron resident at 50%: ~18 MB read per token where "
                              "~80% of 0.42 s of I/O at ~1 GB/s implies ~0.35 GB",
    "flash-mistral-offload50": "as flash-bamboo-offload50 (TurboSparse-Mistral-7B, [PI2] §7.1): 14 MB per token",
    "flash-mistral-inmem": "21.5 vs 12.9 tokens/s: the LLM-in-a-Flash port [PI2] measured is slower than its "
                           "mechanisms on these cores; its compute path is not calibrated",
    "llamacpp-ts-mistral-offload50": "page-cache read-ahead behaviour of Android not calibrated",
    "flash-opt-total": "[FLASH] compute 506 ms/token is a PyTorch-on-CPU figure; the roofline gives 37 ms",
    "flash-opt-total-naive": "as flash-opt-total",
    "flash-opt-compute": "as flash-opt-total",
    "flash-opt-memory-management": "copy costs at DRAM speed give 4 ms; [FLASH] reports 58 ms",
    "flash-speedup-gpu": "18.4x vs 20-25x: the full GPU run is 95 ms of I/O (as flash-opt-io-all) + ~21 ms of "
                         "compute at the M1 Max GPU's assumed 360 GB/s; 20x needs <= 111 ms per token, and "
                         "[FLASH]'s per-component GPU figures are not in the brief",
}


def test_held_points_are_within_tolerance_and_every_point_is_accounted_for():
    """One test, so the table runs once even when the suite is spread over workers."""
    table = validation.validate(decode_tokens=128, on_error="raise").set_index("id")
    runnable = set(table.index[table["modelled"].ne(False)]) if "modelled" in table else set(table.index)
    assert HELD | set(KNOWN_OFF) == runnable
    assert not HELD & set(KNOWN_OFF)
    off = {}
    for point in sorted(HELD):
        row = table.loc[point]
        assert not math.isnan(row["predicted"]), point
        if not row["within_tolerance"]:
            off[point] = f"{row['predicted']:.4g} vs {row['published']:.4g} ({row['error_pct']:+.1f}%)"
    assert not off, off
    improved = [p for p in KNOWN_OFF if table.loc[p, "within_tolerance"]]
    if improved:
        warnings.warn(f"now within tolerance, move to HELD: {improved}", stacklevel=1)
