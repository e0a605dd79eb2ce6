"""Assemble and run one simulation: profiles + trace + strategy -> per-token results.

``simulate`` is the library's main entry point and what ``sim run`` calls. It resolves
names to profiles, sizes DRAM with :func:`sim.profiles.memory.plan_memory`, builds the
simulated machine and the strategy, replays ``warmup_tokens`` of the trace through the
cache (the cache is warm after prefill in a real session), runs prefill and then each
decode token as simpy processes, and summarises.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import simpy

from sim.checks import check_bool, shown
from sim.engine.bottleneck import bottleneck
from sim.engine.config import MAX_TRACE_TOKENS, MODES, RunConfig  # noqa: F401  (re-exported)
from sim.engine.costs import ModelCosts
from sim.engine.machine import Machine, Span, Usage
from sim.engine.metrics import summarise
from sim.engine.strategies import get_strategy
from sim.engine.strategies.base import UNIT_KNOBS, RunContext, TokenStats, parse_knobs
from sim.engine.trace_replay import replayable
from sim.engine.unit_labels import accelerator
from sim.engine.workload import check_trace_matches, iter_token_layers, popularity
from sim.errors import SimError
from sim.lru import kept
from sim.profiles.device import DeviceProfile
from sim.profiles.edits import apply_overrides
from sim.profiles.memory import plan_memory
from sim.profiles.model import ModelProfile
from sim.profiles.registry import load_device, load_model
from sim.traces.format import Trace, TraceMeta

DEFAULT_PROFILE_TOKENS = 64


@dataclass
class SimResult:
    """Per-token rows, a summary, and (when asked for) the timeline spans."""

    tokens: pd.DataFrame
    summary: dict[str, Any]
    spans: list[Span] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    usage: Usage | None = None  # DES only: busy time, flash and DRAM traffic of the whole run


def resolve_trace(model: ModelProfile, trace: str | Path | Trace | None, preset: str | None, n_tokens: int,
                  seed: int, counts_field: str = "--decode-tokens") -> Trace:
    """A trace file, an in-memory trace, or a synthetic one generated on the fly.

    ``counts_field`` names the option(s) that set ``n_tokens``, for the error when the
    trace is shorter."""
    if trace is not None and preset is not None:
        raise SimError("give either --trace or --preset, not both", field="--trace")
    if trace is not None and not isinstance(trace, str | Path | Trace):
        raise SimError(f"expected a trace file path or a Trace, got {type(trace).__name__}", field="--trace")
    if preset is not None and (not isinstance(preset, str) or not preset):
        raise SimError(f"expected a preset name, got {shown(preset)}", field="--preset")
    if isinstance(trace, Trace):
        if not isinstance(getattr(trace, "meta", None), TraceMeta):
            raise SimError("the Trace has no metadata (build one with Trace.load, synth_trace or Trace.from_rows)",
                           field="--trace")
        loaded = trace
    elif trace is not None:
        loaded = Trace.load(trace)
    else:
        loaded = _generated_trace(model, preset or model.name, n_tokens, seed)
    label = str(trace) if isinstance(trace, str | Path) else (
        f"in-memory trace of {loaded.meta.model}" if trace is not None else f"preset {preset or model.name}")
    check_trace_matches(loaded.meta, model, label)
    if loaded.meta.n_tokens < n_tokens:
        raise SimError(f"trace has {loaded.meta.n_tokens} tokens; the run needs {n_tokens} "
                       "(profile plus warm-up plus decode tokens)", source=label, field=counts_field)
    return loaded


# Generated traces kept between runs (each as a ReplayTrace, so the chunks stay in memory
# up to its byte limit): a sweep or a planner simulates many points on the same trace. Across
# processes and runs they come from the on-disk store (sim.traces.store).
GENERATED_TRACE_CACHE = 2
# Chunks of a lazy trace read (or generated) ahead on a background thread while the engine runs.
TRACE_READ_AHEAD = 2
# Generated in chunks of this many tokens (the content does not depend on it): the run waits
# for the first chunk only, so smaller chunks start it sooner; each costs a copy of the state.
GENERATED_CHUNK_TOKENS = 32
_GENERATED: OrderedDict[tuple, Trace] = OrderedDict()


def _generated_trace(model: ModelProfile, name: str, n_tokens: int, seed: int) -> Trace:
    """The synthetic trace of preset ``name`` (bundled, or derived for a model without one:
    :func:`sim.traces.derived.preset_for`) for this model's shape: kept in this process, and
    generated only if the on-disk store (:mod:`sim.traces.store`) does not hold it yet."""
    from sim.traces.derived import preset_for
    from sim.traces.params import SynthDims
    from sim.traces.store import stored_synth_trace

    params = preset_for(name, model, hint="(or pass --trace FILE)")
    dims = SynthDims.from_model(model)
    key = (params.to_yaml(), dims, n_tokens, seed)
    return kept(_GENERATED, key, lambda: replayable(stored_synth_trace(
        params, dims, n_tokens, seed, chunk_tokens=GENERATED_CHUNK_TOKENS), read_ahead=TRACE_READ_AHEAD),
        GENERATED_TRACE_CACHE)


@dataclass
class RunSetup:
    """What a run's configuration resolves to before any trace is read (see :func:`check_options`)."""

    config: RunConfig  # the options as checked (counts as Python ints, the strategy's own rules applied)
    device: DeviceProfile
    model: ModelProfile
    strategy: type
    knobs: Any
    plan: Any  # sim.profiles.memory.MemoryPlan
    compute_cores: list[str]
    io_cores: list[str]


def as_config(config: RunConfig | str | Path | DeviceProfile | None = None, model: Any = None,
              strategy: Any = None, /, **options: Any) -> RunConfig:
    """A :class:`RunConfig`, given as one or spelt as ``simulate``'s keyword options.

    ``simulate(device, model, strategy, offload=0.5)`` and ``simulate(RunConfig(...))`` (or
    ``config=``) are one run: the first positional argument is a configuration or the device.
    """
    if "config" in options:
        if config is not None:
            raise SimError("give the configuration once", field="config")
        config = options.pop("config")
    if isinstance(config, RunConfig):
        if model is not None or strategy is not None or options:
            raise SimError("give a RunConfig or run options, not both", field="config")
        return config
    given = {k: v for k, v in (("device", config), ("model", model), ("strategy", strategy)) if v is not None}
    for key in given:
        if key in options:
            raise SimError(f"{key} given twice (as an argument and as {key}=)", field=key)
    return RunConfig.of(**given, **options)


def check_options(config: RunConfig | str | Path | DeviceProfile | None = None, model: Any = None,
                  strategy: Any = None, /, **options: Any) -> RunSetup:
    """Every check of a run's configuration that needs no trace, and what it resolves to.

    :func:`simulate` starts here, and a sweep calls it on each point before running any
    (``sim.explore.point_checks``), so one set of rules decides what a valid run is. The
    rules that need no profile are :class:`RunConfig`'s validators; here follow those that
    need the device or model. A bad option raises a one-line :class:`SimError` naming it; a
    budget the device cannot hold is found here too (by the memory plan).
    """
    cfg = as_config(config, model, strategy, **options)
    dev = load_device(apply_overrides("device", cfg.device, cfg.overrides))
    mod = load_model(apply_overrides("model", cfg.model, cfg.overrides))
    strat_cls = get_strategy(cfg.strategy)
    knob_values = parse_knobs(strat_cls, dict(cfg.knobs))
    prompt_tokens, decode_tokens = cfg.prompt_tokens, cfg.decode_tokens
    context_tokens = prompt_tokens + decode_tokens
    if context_tokens > mod.max_context:
        raise SimError(f"prompt plus decode tokens must be at most {mod.name}'s max_context "
                       f"{mod.max_context}, got {prompt_tokens} + {decode_tokens} = {context_tokens}",
                       field="--prompt-tokens/--decode-tokens")
    try:
        plan = plan_memory(mod, dev, budget=cfg.memory_budget, offload=cfg.offload, weights_dtype=cfg.weights_dtype,
                           context_tokens=context_tokens, predictor=strat_cls.uses_predictor,
                           split_scales=strat_cls.split_scales)
    except SimError as exc:
        raise strat_cls.memory_error(exc) from None
    for knob in UNIT_KNOBS:  # an accelerator named by a knob must be on the phone
        unit = getattr(knob_values, knob, None)
        if unit in ("gpu", "npu") and accelerator(dev, unit) is None:
            # hot_unit names an accelerator only: leaving it out is how the CPU runs everything
            units = [u for u in ("cpu", "gpu", "npu") if (u == "cpu" and knob != "hot_unit") or
                     (u != "cpu" and accelerator(dev, u) is not None)]
            choice = f"choose one of {', '.join(units)}" if units else "leave it out to run on the CPU"
            raise SimError(f"{dev.name} has no {unit}; {choice}", field=knob)
    compute, io = strat_cls.default_cores(dev, needs_io=plan.offload_fraction > 0, knobs=knob_values)
    given_compute, given_io = getattr(knob_values, "compute_cores", None), getattr(knob_values, "io_cores", None)
    if given_io and not given_compute and plan.offload_fraction > 0:  # the I/O thread's default core computes
        compute = strat_cls.default_compute_beside(dev, list(given_io))
    compute = list(given_compute or compute)
    io = list(given_io or io)
    clusters = [c.name for c in dev.cpu.clusters]
    for knob, names in (("compute_cores", compute), ("io_cores", io)):
        for name in names:
            if name not in clusters:
                raise SimError(f"unknown CPU cluster {name!r}; {dev.name} has {', '.join(clusters)}", field=knob)
    # A compute thread keeps its core busy: more of them than a cluster has cores would be
    # simulated as cores the phone does not have. (I/O threads block on reads, so several may
    # share a core; the flash model counts the cores they occupy.)
    for cluster in dev.cpu.clusters:
        n = compute.count(cluster.name)
        if n > cluster.cores:
            raise SimError(f"puts {n} compute threads on {cluster.name}, which has {cluster.cores} core"
                           f"{'s' if cluster.cores > 1 else ''} on {dev.name}; list it at most "
                           f"{'once' if cluster.cores == 1 else f'{cluster.cores} times'} (a phone with more: "
                           f"--set device.cpu.clusters.{cluster.name}.cores={n})",
                           field="compute_cores")
    return RunSetup(cfg, dev, mod, strat_cls, knob_values, plan, compute, io)


def simulate(config: RunConfig | str | Path | DeviceProfile | None = None, model: Any = None, strategy: Any = None,
             /, *, timeline: bool = False, **options: Any) -> SimResult:
    """Simulate prefill of ``prompt_tokens`` and decode of ``decode_tokens`` tokens.

    Takes a :class:`RunConfig` (``simulate(RunConfig(...))`` or ``config=``) or its options
    as keywords (``simulate("oneplus-12", offload=0.5)``: see :func:`as_config`);
    ``timeline`` records spans, which are output, not configuration.
    """
    wall0 = time.perf_counter()
    timeline = check_bool(timeline, "--timeline")
    cfg = as_config(config, model, strategy, **options)
    if timeline and cfg.mode == "analytic":
        raise SimError("the analytic cost model has no timeline; drop it or use mode 'des'", field="--timeline")
    setup = check_options(cfg)
    dev, mod, strat_cls, knob_values, plan = setup.device, setup.model, setup.strategy, setup.knobs, setup.plan
    trace, preset, mode, seed = cfg.trace, cfg.preset, cfg.mode, cfg.seed
    prompt_tokens, decode_tokens, warmup_tokens = cfg.prompt_tokens, cfg.decode_tokens, cfg.warmup_tokens
    tr, profile_tokens, run_warnings = run_trace(setup)
    first = profile_tokens + warmup_tokens
    env = simpy.Environment()
    machine = Machine(env, dev, setup.compute_cores, setup.io_cores, record_spans=timeline)
    strat = make_strategy(setup, tr.meta, profile_counts(setup, tr, profile_tokens), machine)

    rows: list[dict[str, Any]] = []
    warm = TokenStats()
    prefill_stats = TokenStats()
    tokens_iter = iter_token_layers(tr, profile_tokens, first + decode_tokens)
    for _ in range(warmup_tokens):  # warm the cache untimed (the state after prefill)
        t, layers = next(tokens_iter)
        strat.warm_token(t, layers, warm)

    decode_dram_bytes = None  # the discrete-event run books DRAM traffic; the cost model does not
    decode_flash_requests = None
    prefill_busy: dict[str, float] = {}  # busy seconds per unit during prefill (DES only)
    if mode == "analytic":
        prefill_s = float("nan")
        for _t, layers in tokens_iter:
            stats = TokenStats()
            latency = strat.analytic_token_s(layers, prompt_tokens + len(rows), stats)
            rows.append(_row(len(rows), latency, stats, {}))
        busy: dict[str, float] = {}
    else:
        def session() -> Any:
            start = env.now
            machine.token = -1
            yield from strat.prefill(prefill_stats)
            prefill_done = env.now
            rows.append({"_prefill_s": prefill_done - start, "_dram_bytes": machine.usage.dram_bytes,
                         "_flash_requests": machine.usage.flash_requests,
                         "_prefill_busy_s": {k: v for k, v in machine.usage.busy_s.items() if v > 0}})
            for i, (t, layers) in enumerate(tokens_iter):
                machine.token = i
                stats = TokenStats()
                busy0 = dict(machine.usage.busy_s)
                t0 = env.now
                yield from strat.decode_token(t, layers, prompt_tokens + i, stats)
                busy_tok = {k: v - busy0.get(k, 0.0) for k, v in machine.usage.busy_s.items()}
                rows.append(_row(i, env.now - t0, stats, busy_tok))

        env.process(session())
        env.run()
        first_row = rows.pop(0)
        prefill_s = first_row["_prefill_s"]
        decode_dram_bytes = machine.usage.dram_bytes - first_row["_dram_bytes"]
        decode_flash_requests = machine.usage.flash_requests - first_row["_flash_requests"]
        prefill_busy = first_row["_prefill_busy_s"]
        busy = {c[5:-2]: float(sum(r.get(c, 0.0) for r in rows)) for c in sorted({k for r in rows for k in r})
                if c.startswith("busy_")}
    df = pd.DataFrame(rows)
    summary = summarise(df, plan=plan, device=dev, prefill_s=prefill_s, prompt_tokens=prompt_tokens,
                        busy_s=busy, prefill_busy_s=prefill_busy, decode_dram_bytes=decode_dram_bytes,
                        decode_flash_requests=decode_flash_requests,
                        warnings=run_warnings + sorted(machine.flash.extrapolated))
    phases_s = {c: float(df[c].sum()) for c in summary["phases_ms_per_token"] and
                [f"{p}_s" for p in summary["phases_ms_per_token"]]}
    summary["bottleneck"] = bottleneck(phases_s, busy, float(df["latency_s"].sum()) if len(df) else 0.0, device=dev,
                                       cpu_phases=strat_cls.cpu_phases, dram_bytes=decode_dram_bytes,
                                       flash_bytes=float(df["flash_bytes"].sum()) if len(df) else 0.0,
                                       flash_requests=decode_flash_requests)
    summary.update(device=dev.name, model=mod.name, strategy=strat_cls.name, mode=mode, seed=seed,
                   trace_source=tr.meta.source, wall_s=time.perf_counter() - wall0)
    # which preset made a generated trace, and for a derived one where its groups came from ({}: not derived)
    summary.update(trace_preset=(preset or mod.name) if trace is None else None,
                   trace_derived_from=dict(tr.meta.extra.get("derived_from") or {}) if trace is None else {})
    resolved = cfg.model_copy(update={
        "device": dev.name, "model": mod.name, "strategy": strat_cls.name, "weights_dtype": plan.weights_dtype,
        "profile_tokens": profile_tokens, "knobs": knob_values.model_dump(),
        "preset": (preset or mod.name) if trace is None else None})
    config = {**resolved.dump(), "cores": {"compute": setup.compute_cores, "io": setup.io_cores}}
    if trace is not None and not isinstance(trace, str | Path):
        config["trace"] = None  # an in-memory trace has no name to record
    return SimResult(df, summary, machine.spans, config, machine.usage if mode == "des" else None)


def run_trace(setup: RunSetup) -> tuple[Trace, int, list[str]]:
    """The run's trace (kept in memory as it is read), its profile tokens and its warnings.

    Trace tokens: [0, profile) are the offline profiling run (PowerInfer ranks hot neurons on
    a profiling dataset, not on the tokens it then serves), [profile, +warmup) warm the cache,
    and the rest are decoded. profile_tokens=0 profiles on the decoded tokens themselves (an
    oracle profile). By default a generated trace gets DEFAULT_PROFILE_TOKENS extra tokens;
    a given trace is used as it is (profile 0) unless profile_tokens says otherwise.
    """
    cfg, mod, strat_cls = setup.config, setup.model, setup.strategy
    trace, profile_tokens, warmup_tokens = cfg.trace, cfg.profile_tokens, cfg.warmup_tokens
    run_warnings = strat_cls.run_warnings(cfg)
    if profile_tokens is None:
        profile_tokens = DEFAULT_PROFILE_TOKENS if trace is None else 0
        if trace is not None and strat_cls.keeps_profile:
            run_warnings.append("the hot-neuron profile comes from the decoded tokens themselves (an oracle that "
                                "knows the future, so the hot set is optimistic); --profile-tokens N profiles on "
                                "the trace's first N tokens instead")
    first = profile_tokens + warmup_tokens
    counts = [flag for flag, n in (("--profile-tokens", profile_tokens), ("--warmup-tokens", warmup_tokens)) if n]
    tr = replayable(resolve_trace(mod, trace, cfg.preset, first + cfg.decode_tokens, cfg.seed,
                                  counts_field="/".join([*counts, "--decode-tokens"])), read_ahead=TRACE_READ_AHEAD)
    if tr.meta.model and tr.meta.model != mod.name:
        run_warnings.append(f"the trace is of {tr.meta.model}, the run simulates {mod.name}: same FFN shape, "
                            f"but the activations (sparsity, locality) are {tr.meta.model}'s")
    return tr, profile_tokens, run_warnings


def profile_counts(setup: RunSetup, tr: Trace, profile_tokens: int) -> np.ndarray:
    """The offline profile (activations per neuron key) the run's strategy gets (see :func:`run_trace`)."""
    first = profile_tokens + setup.config.warmup_tokens
    if profile_tokens:
        return popularity(tr, 0, profile_tokens)
    return popularity(tr, first, first + setup.config.decode_tokens)


def make_strategy(setup: RunSetup, meta: TraceMeta, pop: np.ndarray, machine: Machine) -> Any:
    """The run's strategy on ``machine``, for a trace of ``meta`` with offline profile ``pop``."""
    cfg, mod, plan = setup.config, setup.model, setup.plan
    ctx = RunContext(mod, setup.device, plan, ModelCosts(mod, plan.weights_dtype), meta, machine, pop,
                     cfg.prompt_tokens, np.random.default_rng(cfg.seed), cfg.policy)
    return setup.strategy(ctx, setup.knobs)


def _row(i: int, latency_s: float, stats: TokenStats, busy: dict[str, float]) -> dict[str, Any]:
    row: dict[str, Any] = {"token": i, "latency_s": latency_s, "requests": stats.requests, "hits": stats.hits,
                           "misses": stats.misses, "flash_bytes": stats.flash_bytes}
    row.update(stats.phase_s)
    for unit, seconds in busy.items():
        row[f"busy_{unit}_s"] = seconds
    return row
