"""Cheap re-evaluation of the analytic mode, for calibration fits and prediction intervals.

``analytic_decode_tokens_per_s(config)`` returns what ``simulate(config, mode="analytic")``
reports as ``decode_tokens_per_s``, but keeps what an evaluation learns from the trace and the
neuron cache, so evaluating the same model and trace again after a device or profile edit
(CPU, NPU, DRAM or flash speeds, kernel efficiencies, the KV cache's length) costs a few
milliseconds instead of a run:

    from sim.engine.config import RunConfig
    from sim.engine.reevaluate import analytic_decode_tokens_per_s

    base = RunConfig(memory_budget="12GB", decode_tokens=128)
    tps = analytic_decode_tokens_per_s(base)                        # first: trace and cache replay
    faster = analytic_decode_tokens_per_s(base.model_copy(update={"device": edited_profile}))  # ms

What is kept, in this process:

- the trace (a preset's generated trace, as ``simulate`` keeps it, read from the on-disk store
  when another run made it; a trace file's chunks) and its offline profile;
- per *plan key*, the strategy's analytic plans: for PowerInfer-2 every decode token's routing
  (NPU, resident, cold neurons), the cache's hits after the warm-up tokens and the neuron
  clusters. The key is the trace, the token counts, the seed, the strategy and what the
  strategy says its plans depend on (:meth:`~sim.engine.strategies.base.Strategy.analytic_plan_key`;
  PowerInfer-2: the neuron cache's bytes and item size, ``hot_share``, the policy, whether an
  accelerator runs the hot share and which share, ``cluster_neurons``).

An evaluation whose key is kept only applies the device models to the plans, as array
operations over all (token, layer) pairs (``analytic_costs_s``); it is exact (the same plans,
the same cost formulas; sums differ from ``simulate`` in float rounding, ~1e-15) for every
cache policy. A new key (another budget, policy, hot share; a device edit that adds or removes
the accelerator) replays the warm-up and decode tokens through the cache once: a new budget
changes the pinned hot region and with it the stream the cold region sees, and the engine's
batched LRU (hits promoted before misses within a step) is not a stack algorithm (a larger
cache can miss where a smaller one hits, see tests/cache/test_stack_distance.py), so no
one-pass miss-ratio curve gives its answer at another size exactly. Strategies whose analytic
mode is not split (``analytic_plan_key`` None) are evaluated whole by ``simulate``.

``one_pass=True`` trades that exactness for speed across budgets: where the strategy has a
one-pass answer (PowerInfer-2 with an LRU cold region: :mod:`sim.cache.pinned_lru_curve`),
the trace's warm-up and decode tokens are read once (seconds) and each budget after that
costs milliseconds, within a fraction of a per cent of the replay. Other policies
(segmented, window, S3-FIFO, ...) and strategies are replayed as above.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from sim.engine.machine import Machine
from sim.engine.simulation import as_config, check_options, make_strategy, profile_counts, run_trace, simulate
from sim.engine.strategies.base import TokenStats
from sim.engine.workload import iter_token_layers
from sim.traces.format import Trace, TraceMeta

KEPT_PLANS = 16  # plan sets kept (one per budget or cache setting a fit visits); oldest used go first


@dataclass(frozen=True)
class Evaluation:
    """One analytic evaluation: the figure, the per-token times and flash bytes behind it."""

    decode_tokens_per_s: float
    latency_s: np.ndarray
    flash_bytes: np.ndarray
    reused: bool  # the plans were kept from an earlier evaluation (only the device models ran)
    one_pass: bool = False  # the plans came from the one-pass answer across budgets, not a replay


@dataclass
class _Plans:
    plans: Any  # a replay's plan per decode token, or a strategy's budget curve
    meta: TraceMeta
    popularity: np.ndarray
    trace: Any  # an in-memory Trace the key names by id(): held so the id stays its own


_KEPT: OrderedDict[tuple, _Plans] = OrderedDict()
KEPT_CURVES = 2  # one-pass structures kept (each ~0.16 GB for Mixtral's 144 tokens); oldest used go first
_CURVES: OrderedDict[tuple, _Plans] = OrderedDict()  # `plans` holds the strategy's budget curve


def splits(strategy: str) -> bool:
    """Whether ``strategy``'s analytic mode is split (plans kept, a device edit re-prices them in
    milliseconds) rather than re-evaluated whole (a run's seconds)."""
    from sim.engine.strategies import get_strategy
    from sim.engine.strategies.base import Strategy

    return get_strategy(strategy).analytic_plan_key.__func__ is not Strategy.analytic_plan_key.__func__


def analytic_decode_tokens_per_s(config: Any = None, /, *, one_pass: bool = False, **options: Any) -> float:
    """``simulate(config, mode="analytic").summary["decode_tokens_per_s"]``, reusing the plans an
    earlier evaluation of the same trace and cache setting made (see the module docstring).
    Takes a :class:`~sim.engine.config.RunConfig` or ``simulate``'s keyword options.
    ``one_pass``: answer any budget from one pass over the trace where the strategy can (see
    :func:`evaluate`)."""
    return evaluate(config, one_pass=one_pass, **options).decode_tokens_per_s


def evaluate(config: Any = None, /, *, one_pass: bool = False, **options: Any) -> Evaluation:
    """:func:`analytic_decode_tokens_per_s` with the per-token figures behind it.

    ``one_pass``: where the strategy has a one-pass answer across budgets
    (:meth:`~sim.engine.strategies.base.Strategy.budget_curve_key`; PowerInfer-2 with an LRU cold
    region), read the trace once per trace and token counts and answer every budget from that
    in milliseconds, within a fraction of a per cent of the replay
    (:mod:`sim.cache.pinned_lru_curve` says what it approximates; benchmarks/analytic_reeval.py
    prints the error). Elsewhere the plans are replayed as without it (``Evaluation.one_pass``
    says which)."""
    cfg = as_config(config, **options)
    if cfg.mode != "analytic":
        cfg = cfg.model_copy(update={"mode": "analytic"})
    setup = check_options(cfg)
    if one_pass and setup.strategy.budget_curve_key(setup) is not None:
        return _evaluate_one_pass(setup)
    part = setup.strategy.analytic_plan_key(setup)
    if part is None:  # not split: the whole analytic run
        tokens = simulate(cfg).tokens
        latency = tokens["latency_s"].to_numpy()
        return Evaluation(len(latency) / float(latency.sum()), latency, tokens["flash_bytes"].to_numpy(), False)
    kept, strat, reused = _kept(_KEPT, KEPT_PLANS, setup, part, _plan)
    latency, flash = strat.analytic_costs_s(kept.plans, cfg.prompt_tokens + np.arange(cfg.decode_tokens))
    return Evaluation(len(latency) / float(latency.sum()), latency, flash, reused)


def _evaluate_one_pass(setup: Any) -> Evaluation:
    """:func:`evaluate` from the strategy's budget curve, read once per trace and token counts."""
    cfg = setup.config
    kept, strat, reused = _kept(_CURVES, KEPT_CURVES, setup, setup.strategy.budget_curve_key(setup), _read_curve)
    latency, flash = strat.analytic_costs_s(strat.budget_plans(kept.plans),
                                            cfg.prompt_tokens + np.arange(cfg.decode_tokens))
    return Evaluation(len(latency) / float(latency.sum()), latency, flash, reused, one_pass=True)


def _kept(store: OrderedDict[tuple, _Plans], limit: int, setup: Any, part: Any,
          make: Callable[[Any, Machine], tuple[_Plans, Any]]) -> tuple[_Plans, Any, bool]:
    """(what ``store`` keeps for this trace, token counts and ``part``, made by ``make`` if it
    keeps nothing yet, the oldest used dropped past ``limit``; the run's strategy; whether kept)."""
    cfg = setup.config
    key = (_trace_identity(setup), cfg.profile_tokens, cfg.warmup_tokens, cfg.decode_tokens, cfg.prompt_tokens,
           cfg.seed, setup.strategy.name, part)
    machine = Machine(simpy.Environment(), setup.device, setup.compute_cores, setup.io_cores)
    kept = store.get(key)
    if kept is None:
        kept, strat = make(setup, machine)
        store[key] = kept
        while len(store) > limit:
            store.popitem(last=False)
        return kept, strat, False
    store.move_to_end(key)
    return kept, make_strategy(setup, kept.meta, kept.popularity, machine), True


def _read_curve(setup: Any, machine: Machine) -> tuple[_Plans, Any]:
    """Read the warm-up and decode tokens once into the strategy's budget curve."""
    strat, tokens, kept = _replayed(setup, machine)
    return _Plans(strat.budget_curve(tokens, setup.config.warmup_tokens), *kept), strat


def _plan(setup: Any, machine: Machine) -> tuple[_Plans, Any]:
    """Warm the cache and plan every decode token, as ``simulate``'s analytic mode does."""
    strat, tokens, kept = _replayed(setup, machine)
    warm = TokenStats()
    for _ in range(setup.config.warmup_tokens):
        t, layers = next(tokens)
        strat.warm_token(t, layers, warm)
    return _Plans([strat.analytic_plan(layers, TokenStats()) for _t, layers in tokens], *kept), strat


def _replayed(setup: Any, machine: Machine) -> tuple[Any, Any, tuple]:
    """The run's strategy, its warm-up and decode tokens (``(t, TokenWork)``, in order) and what
    a :class:`_Plans` keeps beside them (the trace's meta, the offline profile, the trace held)."""
    cfg = setup.config
    tr, profile_tokens, _ = run_trace(setup)
    pop = profile_counts(setup, tr, profile_tokens)
    first = profile_tokens + cfg.warmup_tokens
    tokens = iter_token_layers(tr, profile_tokens, first + cfg.decode_tokens)
    held = cfg.trace if isinstance(cfg.trace, Trace) else None
    return make_strategy(setup, tr.meta, pop, machine), tokens, (tr.meta, pop, held)


def _trace_identity(setup: Any) -> tuple:
    """What names the trace an evaluation reads: a preset's (with its file's state, for the
    model's shape after any profile edits), a trace file's path and state, or an in-memory
    trace object."""
    cfg, model = setup.config, setup.model
    trace = cfg.trace
    if trace is None:
        from sim.traces.params import PRESET_DIR

        name = cfg.preset or model.name
        path = PRESET_DIR / f"{name}.yaml"
        stat = path.stat() if path.is_file() else None
        dims = (model.n_layers, model.ffn_dim, model.hidden, model.n_experts, model.top_k, model.name)
        return ("preset", name, stat and (stat.st_mtime_ns, stat.st_size), dims)
    if isinstance(trace, str | Path):
        path = Path(trace).resolve()
        stat = path.stat()
        return ("file", str(path), stat.st_mtime_ns, stat.st_size)
    return ("object", id(trace))


def forget() -> None:
    """Drop every kept plan set and budget curve (the next evaluation of each key reads its trace again)."""
    _KEPT.clear()
    _CURVES.clear()
