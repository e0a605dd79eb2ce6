"""How far a run's decode speed is from its steady state: warm-up detection and a confidence interval.

A decode run starts with a neuron cache warmed only by ``warmup_tokens`` of the trace, and
its context (hence attention and KV traffic) grows with every token, so the first tokens
of a run are not typical of the rest. Two standard output-analysis steps turn the per-token
latencies into a figure with an honest error bar:

- **MSER-5** (White 1997; Hoad, Robinson & Davies 2010): group the latencies into batches
  of five, and delete the leading batches whose removal minimises the marginal standard
  error ``var(rest) / len(rest)`` of what remains (searched over the first half only, as the
  method prescribes). The deleted tokens are the detected warm-up.
- **Batch means**: the remaining tokens are cut into ``BATCHES`` contiguous batches whose
  means are close to independent (neighbouring tokens share a cache state, so the tokens
  themselves are not), and a Student-t interval of their mean is the 95% confidence
  interval of the mean latency. Tokens/s is one over the mean latency, so the interval's
  ends are the reciprocals of the latency interval's.

The figures are about the run's steady state after its warm-up; ``decode_tokens_per_s``
itself stays the whole run's figure (tokens over time), which is what a benchmark of the
same length would measure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MSER_BATCH = 5
# Batches of the batch-means interval: 10-30 is the usual range (fewer makes the t quantile
# wide, more makes the batches short enough to be correlated).
BATCHES = 20
# The fewest tokens left after the warm-up for which an interval is reported: two batches.
MIN_STEADY_TOKENS = 2 * MSER_BATCH
CONFIDENCE = 0.95


@dataclass(frozen=True)
class SteadyState:
    """The steady-state decode figures of one run's per-token latencies."""

    warmup_tokens: int  # deleted by MSER-5
    tokens: int  # after the warm-up
    decode_tokens_per_s: float  # tokens / time after the warm-up
    ci: tuple[float, float] | None  # 95% interval of decode_tokens_per_s; None when too few tokens
    batches: int

    @property
    def half_width(self) -> float:
        """The interval's half-width relative to its midpoint (inf without an interval)."""
        if self.ci is None:
            return math.inf
        lo, hi = self.ci
        return (hi - lo) / (hi + lo) if math.isfinite(hi) and hi + lo > 0 else math.inf

    def as_dict(self) -> dict[str, float | int]:
        """The summary's ``steady_state`` (``half_width`` only with an interval)."""
        out = {"warmup_tokens": self.warmup_tokens, "tokens": self.tokens,
               "decode_tokens_per_s": self.decode_tokens_per_s, "batches": self.batches}
        return out if self.ci is None else {**out, "half_width": self.half_width}


def mser5_warmup(latencies: np.ndarray) -> int:
    """Tokens to delete as warm-up: MSER over batches of :data:`MSER_BATCH` latencies."""
    x = np.asarray(latencies, dtype=float)
    m = len(x) // MSER_BATCH
    if m < 4:
        return 0
    z = x[: m * MSER_BATCH].reshape(m, MSER_BATCH).mean(axis=1)
    # suffix sums give each truncation's variance in one pass
    rest = np.arange(m, 0, -1, dtype=float)
    s1 = np.cumsum(z[::-1])[::-1]
    s2 = np.cumsum((z * z)[::-1])[::-1]
    sse = s2 - s1 * s1 / rest
    mser = sse / (rest * rest)
    d = int(np.argmin(mser[: m // 2 + 1]))
    return d * MSER_BATCH


def student_t_quantile(p: float, df: int) -> float:
    """Student's t quantile. From scipy.special, not scipy.stats: importing scipy.stats costs
    every run over half a second, the same quantile from scipy.special a third of that."""
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


def batch_means_ci(x: np.ndarray, batches: int = BATCHES, confidence: float = CONFIDENCE
                   ) -> tuple[float, float, float, int] | None:
    """(mean, lower, upper, batches used) of ``x``'s mean by non-overlapping batch means; None
    when ``x`` has fewer than :data:`MIN_STEADY_TOKENS` values."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n < MIN_STEADY_TOKENS:
        return None
    k = min(batches, n // MSER_BATCH)
    size = n // k
    used = x[n - k * size:]  # the remainder is dropped at the start, next to the warm-up
    means = used.reshape(k, size).mean(axis=1)
    mean = float(used.mean())
    half = student_t_quantile(0.5 + confidence / 2, k - 1) * float(means.std(ddof=1)) / math.sqrt(k)
    return mean, mean - half, mean + half, k


def steady_state(latencies_s: np.ndarray) -> SteadyState:
    """The steady state of a run's per-token decode latencies (seconds)."""
    lat = np.asarray(latencies_s, dtype=float)
    warm = mser5_warmup(lat)
    rest = lat[warm:]
    total = float(rest.sum())
    tps = len(rest) / total if total > 0 else math.inf
    ci = None
    batches = 0
    stats = batch_means_ci(rest)
    if stats is not None:
        _mean, lo, hi, batches = stats
        # tokens/s = 1 / mean latency: the interval's ends swap; a lower end at or below zero is unbounded
        ci = (1.0 / hi if hi > 0 else 0.0, 1.0 / lo if lo > 0 else math.inf)
    return SteadyState(warm, len(rest), tps, ci, batches)
