"""The published points the simulator reproduces, held at their tolerance.

Runs the whole table of ``validation/published.yaml`` once with the bundled calibration's
in-sample values (the figures ``sim validate`` prints and judges; about a minute). Every point
that runs is held to its tolerance
unless the data carries a ``known_gap``: what is known about why the prediction is off,
which ``sim validate`` prints under its table. A point with such a note that comes within
tolerance fails here too, so the notes never outlive the gap they explain.
"""

from __future__ import annotations

import math

from sim import validation
from sim.calibrate.calibration import load_calibration
from sim.calibrate.report import calibrated_table
from sim.engine.config import DEFAULT_DECODE_TOKENS

# Held to tolerance, whatever their notes say: the figures the profiles and the trace
# presets are built to reproduce. A known_gap on one of these would hide a regression.
MUST_HOLD = {
    # [PI2] Fig. 10, §7.2.1 and §7.3: TurboSparse-Mixtral-47B on the OnePlus 12
    "pi2-mixtral-19gb", "pi2-mixtral-miss-mean", "pi2-mixtral-miss-p99",
    # ([PI2] §7.5's neuron-cache hit rate is not here: the 7B family's skew is a fitted unknown that the
    # TurboSparse-Mistral-7B points share, so the fit, not the preset, decides it (-2.4% today); nor is §7.2.1's
    # 50%-offload speed: since the context-shift share is fitted too, no preset value is set by hand to it,
    # and the fitted values leave it ~4% from the 19 GB run's speed where [PI2] has 17%: +2.4% today, in tolerance)
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


def test_every_point_is_within_tolerance_or_says_why_not():
    """One test, so the table runs once even when the suite is spread over workers."""
    calibration = load_calibration(None)
    table = calibrated_table(validation.validate(decode_tokens=DEFAULT_DECODE_TOKENS, on_error="raise"), calibration,
                             decode_tokens=DEFAULT_DECODE_TOKENS, folds=False).set_index("id")
    runs = table[table["modelled"].ne(False)]
    noted = {p for p in runs.index if isinstance(runs.loc[p, "known_gap"], str)}
    assert set(runs.index) >= MUST_HOLD
    assert not MUST_HOLD & noted, "a point the profiles are built to reproduce cannot be a known gap"
    off, stale = {}, []
    for point, row in runs.iterrows():
        assert not math.isnan(row["predicted"]), point
        if row["within_tolerance"] and point in noted:
            stale.append(point)
        elif not row["within_tolerance"] and point not in noted:
            off[point] = f"{row['predicted']:.4g} vs {row['published']:.4g} ({row['error_pct']:+.1f}%)"
    assert not off, f"outside tolerance with no known_gap in published.yaml: {off}"
    assert not stale, f"now within tolerance: drop their known_gap from published.yaml: {stale}"
