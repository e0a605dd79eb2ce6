"""``--decode-tokens auto``: replicate the default-length run until its interval is tight.

A run's tokens/s moves with its length, and not only by noise: the context grows with every
token (attention reads a longer KV cache) and the activations drift away from the hot set
the offline profile found (docs/steady_state.md). A longer run therefore converges to the
figure of a *longer workload*, not to a truer figure of the same one: on the 12 GB
Mixtral-47B run, 1,024 and 2,048 tokens give intervals that do not overlap. So ``auto``
keeps the stated run length (:data:`~sim.engine.config.DEFAULT_DECODE_TOKENS`, the one
sim plan, validate and sweeps use) and replicates it with independent activation traces
(:func:`replication_seed`: the run's own seed first, then seeds drawn from it, so two
``auto`` runs of different seeds share no replication), each replication's steady-state figure after its
MSER-5 warm-up (:mod:`sim.engine.steady_state`) one observation, until the Student-t 95%
interval of their mean is within :data:`AUTO_HALF_WIDTH` of it, from
:data:`AUTO_MIN_REPLICATIONS` up to at most :data:`AUTO_MAX_REPLICATIONS`. Replications
also cover what one trace's batch means cannot: how much the figure depends on the trace.
A run that stops at the cap says so in its warnings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sim.engine.config import DEFAULT_DECODE_TOKENS, RunConfig
from sim.engine.steady_state import CONFIDENCE, student_t_quantile
from sim.errors import SimError

AUTO = "auto"
AUTO_HALF_WIDTH = 0.02  # of the figure, at 95% confidence
# Stopping on few replications trusts a spread estimated from a handful of figures: on the
# 12 GB Mixtral-47B run (per-replication spread 2.6%, measured on 120 seeds), the procedure
# below covered the 120-seed mean 90% of the time starting from 3 replications, 92% from 5,
# 94% from 10 (4,000 emulated runs; it then runs 11 on average instead of 9).
AUTO_MIN_REPLICATIONS = 10
# 16 replications of the default 128 tokens are 2,048 tokens: a minute for the 12 GB
# Mixtral-47B run here, whose spread across traces (~2%) needs about six.
AUTO_MAX_REPLICATIONS = 16


def parse_decode_tokens(value: Any, field: str = "--decode-tokens") -> int | str:
    """A decode-token count as typed: a positive integer or ``auto``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == AUTO:
        return AUTO
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise SimError(f"must be a positive integer or auto, got {value!r}", field=field)


def replication_interval(figures: list[float]) -> tuple[float, float, float]:
    """(mean, lower, upper): the Student-t 95% interval of the mean of replications' figures."""
    x = np.asarray(figures, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, -math.inf, math.inf
    half = student_t_quantile(0.5 + CONFIDENCE / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, mean - half, mean + half


def replication_seed(seed: int, index: int) -> int:
    """The trace seed of replication ``index`` of a run of ``seed``: ``seed`` itself first (so an
    ``auto`` run's first replication is the fixed-length run of its seed), then seeds drawn
    from ``(seed, index)``, so the replications of different seeds are independent (seeds
    ``seed + 1 ...`` would make the runs of neighbouring seeds share all but one)."""
    if index == 0:
        return seed
    state = np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0]
    return int(state >> np.uint64(1))  # a valid --seed: [0, 2**63 - 1]


def replications_needed(figures: list[float]) -> int:
    """How many replications the spread of ``figures`` suggests reach the target (at least one more)."""
    mean, lo, hi = replication_interval(figures)
    half = (hi - lo) / 2 / abs(mean) if mean else math.inf
    if not math.isfinite(half):
        return len(figures) + 1
    return max(len(figures) + 1, math.ceil(len(figures) * (half / AUTO_HALF_WIDTH) ** 2))


def simulate_until_steady(config: RunConfig, variant: Callable[..., RunConfig] | None = None,
                          **simulate_options: Any) -> Any:
    """Replications of the default-length run until the 95% interval of their steady-state
    figure is within :data:`AUTO_HALF_WIDTH` (or :data:`AUTO_MAX_REPLICATIONS`).

    ``variant(**changes)`` gives the run with other options (seed, decode_tokens); by default
    ``config`` with them, but a calibrated run's trace is made for its seed and length, so
    sim run passes one that calibrates again (:meth:`sim.commands.run.RunRequest.variant`).
    Returns the first replication's result (its other figures, latency percentiles and hit
    ratios, are that run's) with its summary's ``steady_state`` and
    ``decode_tokens_per_s_ci`` those of all replications, ``decode_tokens_per_s`` their
    tokens over their time, and ``decode_tokens_auto`` recording them.
    """
    from sim.engine.simulation import simulate

    def copied(**changes: Any) -> RunConfig:
        return config.model_copy(update=changes)

    make = variant or copied

    def at(offset: int) -> RunConfig:
        return make(decode_tokens=DEFAULT_DECODE_TOKENS, seed=replication_seed(config.seed, offset))

    results = []
    figures: list[float] = []
    latency_sums: list[float] = []
    want = AUTO_MIN_REPLICATIONS
    while True:
        while len(results) < min(want, AUTO_MAX_REPLICATIONS):
            result = simulate(at(len(results)), **simulate_options)
            results.append(result)
            figures.append(float(result.summary["steady_state"]["decode_tokens_per_s"]))
            latency_sums.append(float(result.tokens["latency_s"].sum()))
        mean, lo, hi = replication_interval(figures)
        half = (hi - lo) / 2 / mean if mean > 0 else math.inf
        if half <= AUTO_HALF_WIDTH or len(results) >= AUTO_MAX_REPLICATIONS:
            break
        want = min(replications_needed(figures), 2 * len(results))  # the estimate is rough on few
    met = half <= AUTO_HALF_WIDTH
    out = results[0]
    n_tokens = sum(len(r.tokens) for r in results)
    summary = out.summary
    summary["decode_tokens_per_s"] = n_tokens / sum(latency_sums)
    summary["decode_tokens_per_s_ci"] = [lo, hi]
    summary["steady_state"] = {**summary["steady_state"], "decode_tokens_per_s": mean, "half_width": half,
                               "replications": len(results)}
    summary["decode_tokens_auto"] = {
        "decode_tokens": DEFAULT_DECODE_TOKENS, "replications": len(results),
        "seeds": [int(r.summary["seed"]) for r in results], "figures": figures,
        "target_half_width": AUTO_HALF_WIDTH, "max_replications": AUTO_MAX_REPLICATIONS, "met": met}
    if not met:
        summary.setdefault("warnings", []).append(
            f"--decode-tokens auto stopped at its cap of {AUTO_MAX_REPLICATIONS} replications with a half-width of "
            f"{half:.1%} (target {AUTO_HALF_WIDTH:.0%}): the figure is less certain than asked")
    return out
