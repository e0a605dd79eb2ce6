"""The offline planner: the strategy knobs that run a model fastest on a device at a budget.

[PI2 §5.3]'s planner takes the device's profiles and the user's memory limit and chooses
the compute threads and their cores, the I/O core, the neuron-cluster size and the
hot/cold split (the paper solves its cost model with an SMT solver). Here the cost model
is the engine's own analytic mode, and the search is explicit. What is searched is the
strategy's own declaration (:meth:`~sim.engine.strategies.base.Strategy.plan_space`, its
``plan_knobs``; PowerInfer-2's families are the core layout, hot-region share, cold-region
policy among the cache registry's plan candidates, cluster size, NPU share, and whether
the GPU runs that share); every candidate is a :class:`~sim.engine.config.RunConfig`:

1. **Prune** with the analytic mode on a short stretch of the trace. Starting from the
   default configuration, each pass evaluates, as one parallel batch, every change of a
   single knob family, then the best value of every family combined (families interact,
   so the combination is evaluated too, not assumed); the best setting seen starts the
   next pass.
   ``passes`` rounds, stopping early when a pass finds nothing better.
2. **Confirm** the ``confirm`` best candidates other than the default, and the default
   configuration, with the discrete-event simulation; the plan is the best confirmed
   candidate for the objective (``tokens_per_s``, or ``energy`` per token among candidates
   meeting ``min_tokens_per_s``). The default is always confirmed, so the plan is never slower
   than the default under the DES it was confirmed with.

Energy has no analytic model (it needs the DES's busy times), so energy plans are pruned
by speed and ranked by DES energy.
"""

from __future__ import annotations

import math
import numbers
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.checks import check_int
from sim.engine.config import DEFAULT_DECODE_TOKENS, RunConfig
from sim.engine.strategies import get_strategy
from sim.engine.strategies.search import family_knobs
from sim.errors import SimError
from sim.explore.executors import Executor, make_executor
from sim.explore.resolve import canonical_json, config_columns, config_task
from sim.explore.spec import Point
from sim.explore.sweep import run_points

OBJECTIVES = ("tokens_per_s", "energy")


@dataclass
class Candidate:
    """One knob setting and what it measured."""

    knobs: dict[str, Any]  # searched knobs that differ from the strategy's defaults
    config: RunConfig | None = None  # the run it was evaluated as (the DES one once confirmed); None: invalid
    analytic_tokens_per_s: float = math.nan
    tokens_per_s: float = math.nan  # DES (NaN when not confirmed)
    energy_j_per_token: float = math.nan
    error: str | None = None

    @property
    def key(self) -> str:
        return canonical_json(self.knobs)


@dataclass
class PlanResult:
    strategy: str
    device: str
    model: str
    memory_budget: Any
    objective: str
    best: Candidate
    default: Candidate
    runners_up: list[Candidate]
    resolved_knobs: dict[str, Any]  # the plan's searched knobs, every one spelled out
    analytic_evaluations: int
    des_evaluations: int
    settings: dict[str, Any] = field(default_factory=dict)
    # profile edits the plan was made with (`sim plan --set`), and each as it was typed
    overrides: dict[str, Any] = field(default_factory=dict)
    set_args: dict[str, str] = field(default_factory=dict)
    # digests of the (edited) profiles planned for: `sim run --plan` compares its own to them
    profile_hashes: dict[str, str] = field(default_factory=dict)
    # profiles given as objects or mappings, which no command-line name reproduces
    given_as_objects: tuple[str, ...] = ()

    def plan_mapping(self) -> dict[str, Any]:
        """What ``sim run --plan FILE`` reads (``knobs``), plus the prediction and runner-ups."""

        def figures(c: Candidate) -> dict[str, Any]:
            out: dict[str, Any] = {"decode_tokens_per_s": _round(c.tokens_per_s),
                                   "analytic_tokens_per_s": _round(c.analytic_tokens_per_s)}
            if not math.isnan(c.energy_j_per_token):
                out["energy_j_per_token"] = _round(c.energy_j_per_token)
            return out

        return {
            "strategy": self.strategy,
            "device": self.device,
            "model": self.model,
            "memory_budget": self.memory_budget,
            **({"overrides": self.overrides} if self.overrides else {}),
            **({"profile_hashes": self.profile_hashes} if self.profile_hashes else {}),
            "objective": self.objective,
            "knobs": self.resolved_knobs,
            "predicted": {**figures(self.best), "mode": "des", **self.settings},
            "default_configuration": figures(self.default),
            "runners_up": [{"knobs": c.knobs, **figures(c)} for c in self.runners_up],
        }

    def to_yaml(self) -> str:
        preset = self.settings.get("preset")
        sets = "".join(f" --set {shlex.quote(f'{key}={text}')}" for key, text in self.set_args.items())
        refs = {kind: "THE-PROFILE-YOU-PLANNED-FOR.yaml" if kind in self.given_as_objects else name
                for kind, name in (("device", self.device), ("model", self.model))}
        note = (f"# ({' and '.join(self.given_as_objects)} given as a profile object: save it as YAML, e.g. "
                "yaml.safe_dump(profile.model_dump(mode='json')), to run it; the profile_hashes below tell "
                "sim run --plan whether it is the same)\n") if self.given_as_objects else ""
        # The run the prediction was confirmed with, so the printed command reproduces it
        # exactly (sim run's defaults differ: 128 decode tokens against the plan's 32).
        tokens = self.settings.get("decode_tokens")
        warmup, seed = self.settings.get("warmup_tokens", 16), self.settings.get("seed", 0)
        default_strategy = RunConfig.model_fields["strategy"].default
        flags = (f" --strategy {self.strategy}" if self.strategy != default_strategy else "") + \
            (f" --decode-tokens {tokens}" if tokens is not None else "") + \
            (f" --warmup-tokens {warmup}" if warmup != 16 else "") + (f" --seed {seed}" if seed else "") + \
            _calibration_flag(self.settings.get("calibration"))  # the command reproduces the plan's figures
        head = (f"# sim plan: {self.model} on {self.device} at memory budget {self.memory_budget} "
                f"(objective {self.objective})\n"
                f"# use it: sim run --device {refs['device']} --model {refs['model']} "
                f"--memory-budget {self.memory_budget}{f' --preset {preset}' if preset else ''}{flags}{sets} "
                "--plan PLAN.yaml\n") + note
        return head + yaml.dump(self.plan_mapping(), Dumper=_PlanDumper, sort_keys=False, default_flow_style=False)


def _calibration_flag(label: str | None) -> str:
    """``sim run``'s flag for the calibration a plan was searched with (none for the bundled one)."""
    from sim.calibrate.calibration import BUNDLED_LABEL

    return "" if label in (None, BUNDLED_LABEL) else f" --calibration {shlex.quote(label)}"


class _PlanDumper(yaml.SafeDumper):
    """Block mappings, but core lists on one line (``[big, mid-hi, mid-hi]``)."""


_PlanDumper.add_representer(list, lambda d, v: d.represent_sequence(
    "tag:yaml.org,2002:seq", v, flow_style=all(not isinstance(x, dict | list) for x in v)))


def _round(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(f"{v:.6g}")


def plan(device: Any = None, model: Any = None, *, strategy: str | None = None, memory_budget: Any = None,
         objective: str = "tokens_per_s", min_tokens_per_s: float | None = None, prune_tokens: int = 8,
         confirm_tokens: int = DEFAULT_DECODE_TOKENS, warmup_tokens: int = 16, confirm: int = 3, passes: int = 2,
         seed: int = 0,
         preset: str | None = None, overrides: dict[str, Any] | None = None, workers: int = 1,
         executor: Executor | None = None, calibration: str | Path | None = None) -> PlanResult:
    """Search ``strategy``'s plannable knobs for ``model`` on ``device`` at ``memory_budget``.

    Device, model and strategy default to a run's (:class:`RunConfig`'s); ``overrides`` are
    profile edits (``device.<path>``/``model.<path>``: a phone that does not exist yet), as
    ``sim run --set`` gives them. ``calibration`` is applied to every candidate as ``sim run``
    applies it (None: the bundled one; ``none``: the microbenchmark-only prediction).
    """
    from sim.engine.strategies import REGISTRY, get_strategy
    from sim.explore.point_checks import check_task
    from sim.profiles.edits import apply_overrides
    from sim.profiles.registry import load_device, load_model

    if objective not in OBJECTIVES:
        raise SimError(f"must be one of {', '.join(OBJECTIVES)}; got {objective!r}", field="--objective")
    prune_tokens, confirm_tokens, confirm, passes = (
        check_int(value, name, 1, None) for name, value in (("--prune-tokens", prune_tokens),
                                                            ("--confirm-tokens", confirm_tokens),
                                                            ("--confirm", confirm), ("--passes", passes)))
    if min_tokens_per_s is not None and (isinstance(min_tokens_per_s, bool)
                                         or not isinstance(min_tokens_per_s, numbers.Real)
                                         or not 0 < min_tokens_per_s < math.inf):
        raise SimError(f"must be a number > 0, got {min_tokens_per_s!r}", field="--min-tokens-per-s")
    defaults = RunConfig.defaults()
    device = defaults["device"] if device is None else device
    model = defaults["model"] if model is None else model
    strategy_cls = get_strategy(defaults["strategy"] if strategy is None else strategy)
    if not strategy_cls.plan_knobs:
        plannable = sorted(name for name, cls in REGISTRY.items() if cls.plan_knobs)
        raise SimError(f"the {strategy_cls.name} strategy declares no knobs to plan; plannable: "
                       f"{', '.join(plannable)}", field="--strategy")
    dev = load_device(device)
    # a name stays a name (the plan file names it); a path, a mapping or an object is the profile itself
    base = RunConfig.of(source="sim plan", device=device if isinstance(device, str) else dev,
                        model=model if isinstance(model, str) else load_model(model), strategy=strategy_cls.name,
                        memory_budget=memory_budget, warmup_tokens=warmup_tokens, seed=seed, preset=preset,
                        overrides=overrides or {})
    edited = load_device(apply_overrides("device", base.device, base.overrides))  # the phone planned for
    if objective == "energy" and edited.power is None:
        raise SimError(f"{edited.name}'s profile has no power figures, so energy per token is unknown; add a power "
                       "section or plan for tokens_per_s", field="--objective")
    tokens = {"analytic": prune_tokens, "des": confirm_tokens}  # decode tokens of a pruning, a confirming run
    # Every run option, the trace and the budget's room, as `sim run` checks them, for both kinds of
    # evaluation (pruning and confirming), before the search starts.
    tasks = []
    for mode, flag in (("analytic", "--prune-tokens"), ("des", "--confirm-tokens")):
        task = _task(_candidate(base, {}, mode, tokens[mode]), calibration)
        try:
            check_task(task, capacity=True)
        except SimError as exc:  # the run's decode tokens are this flag's here
            if exc.field in ("--decode-tokens", "--prompt-tokens/--decode-tokens"):
                raise SimError(exc.detail, source=exc.source, field=flag) from None
            raise
        tasks.append(task)
    base_task = tasks[0]
    own = executor is None
    ex = executor or make_executor(workers)
    try:
        search = _Search(ex, base, tokens, calibration)
        current: dict[str, Any] = {}
        space = [(name, settings, family_knobs(settings)) for name, settings in strategy_cls.plan_space(edited)]
        for _ in range(passes):
            # One batch: every single-family change of the current setting (parallel-friendly).
            trials = [current] + [search.merge(current, opt, keys) for _family, options, keys in space
                                  for opt in options]
            search.evaluate(trials)
            # Then the best value of each family together (families interact, so it is checked).
            combined = dict(current)
            for _family, options, keys in space:
                best_opt = max(options, key=lambda o, keys=keys: search.score(search.merge(current, o, keys)))
                if search.score(search.merge(current, best_opt, keys)) > search.score(current):
                    combined = search.merge(combined, best_opt, keys)
            search.evaluate([combined])
            best = max(search.analytic.values(), key=lambda c: search.score(c.knobs)).knobs
            if canonical_json(best) == canonical_json(current):
                break
            current = best
        ranked = sorted((c for c in search.analytic.values() if c.error is None and c.knobs != {}),
                        key=lambda c: -c.analytic_tokens_per_s)
        shortlist = [c.knobs for c in ranked[:confirm]] + [{}]  # the default is always confirmed too
        confirmed = search.confirm(shortlist)
    finally:
        if own:
            ex.close()
    default = next(c for c in confirmed if c.knobs == {})
    ok = [c for c in confirmed if c.error is None and not math.isnan(c.tokens_per_s)]
    if not ok:
        raise SimError(f"no configuration could be simulated: {default.error}", field="--memory-budget")
    feasible = [c for c in ok if min_tokens_per_s is None or c.tokens_per_s >= min_tokens_per_s]
    if not feasible:
        fastest = max(ok, key=lambda c: c.tokens_per_s)
        raise SimError(f"no plan reaches {min_tokens_per_s:g} tokens/s at this budget; the fastest found gives "
                       f"{fastest.tokens_per_s:.3g} tokens/s ({_describe(fastest.knobs)})", field="--min-tokens-per-s")

    def goal(c: Candidate) -> tuple[float, int]:
        value = c.tokens_per_s if objective == "tokens_per_s" else -_energy(c)
        return value, int(c.knobs == {})  # ties go to the default (fewer changes)

    feasible.sort(key=goal, reverse=True)
    best = feasible[0]
    runners = feasible[1:] + [c for c in confirmed if c not in feasible]
    settings = {"decode_tokens": confirm_tokens, "warmup_tokens": warmup_tokens, "seed": seed,
                "prune_tokens": prune_tokens, **({"preset": preset} if preset else {}),
                "calibration": base_task.get("calibration", {}).get("source", "none")}

    def named(ref: Any, name: str) -> str:  # what a command line gives: the name, or the file's path
        return ref if isinstance(ref, str) else str(ref) if isinstance(ref, Path) else name

    return PlanResult(strategy_cls.name, named(device, dev.name), named(model, base_task["model"]["name"]),
                      memory_budget, objective, best, default, runners, _spell_out(best), len(search.analytic),
                      len(confirmed), settings, overrides=dict(base.overrides),
                      profile_hashes={"device": base_task["device_hash"], "model": base_task["model_hash"]},
                      given_as_objects=tuple(kind for kind, ref in (("device", device), ("model", model))
                                             if not isinstance(ref, str | Path)))


def _energy(c: Candidate) -> float:
    return c.energy_j_per_token if not math.isnan(c.energy_j_per_token) else math.inf


def _task(config: RunConfig, calibration: str | Path | None) -> dict[str, Any]:
    """The task of a candidate's configuration; a bad setting is reported under the ``sim plan``
    flag that set it."""
    try:
        return config_task(config, calibration=calibration)
    except SimError as exc:
        if exc.field and not exc.field.startswith("-") and exc.field in RunConfig.model_fields:
            raise SimError(exc.detail, source=exc.source, field="--" + exc.field.replace("_", "-")) from None
        raise


def _candidate(base: RunConfig, knobs: dict[str, Any], mode: str, decode_tokens: int) -> RunConfig:
    """The run of ``knobs`` on ``base`` in ``mode`` (analytic: pruning, des: confirming)."""
    return RunConfig.of(source="sim plan", **{**dict(base), "knobs": knobs, "mode": mode,
                                              "decode_tokens": decode_tokens})


def _describe(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "default configuration"


def _spell_out(best: Candidate) -> dict[str, Any]:
    """Every searched knob of the plan with the value it runs with, default core layout included
    (a self-contained plan): the cores as the run resolves them, then the strategy's own defaults."""
    from sim.engine.simulation import check_options

    assert best.config is not None  # a confirmed candidate that ran
    setup = check_options(best.config)
    # the candidate's own values over the resolved ones they equal: the YAML dump then shares the
    # lists the runner-ups share (anchors), as plan files always have
    full = {**setup.knobs.model_dump(), "compute_cores": setup.compute_cores, "io_cores": setup.io_cores,
            **best.knobs}
    full = setup.strategy.spelled_out(full, setup.device)
    return {k: full[k] for k in setup.strategy.plan_knobs}


class _Search:
    """Evaluations so far, by knob setting (nothing is simulated twice); each a RunConfig of ``base``
    with the setting's knobs."""

    def __init__(self, ex: Executor, base: RunConfig, tokens: dict[str, int], calibration: str | Path | None):
        self.ex = ex
        self.base = base
        self.calibration = calibration
        self.tokens = tokens
        self.defaults = get_strategy(base.strategy).knobs_model().model_dump()
        self.analytic: dict[str, Candidate] = {}

    def merge(self, current: dict[str, Any], option: dict[str, Any], family: set[str]) -> dict[str, Any]:
        """``current`` with ``option`` chosen from its family: a family of one knob changes its value
        where it stands, one of several (a core layout) is replaced whole, its knobs listed last, as
        plans have always listed them. Knobs equal to the strategy's default are left out, so one
        setting has one spelling."""
        merged = {k: v for k, v in current.items() if k not in family or (len(family) == 1 and k in option)}
        merged.update(option)
        return {k: v for k, v in merged.items() if self.defaults.get(k, object()) != v}

    def score(self, knobs: dict[str, Any]) -> float:
        c = self.analytic.get(canonical_json(knobs))
        if c is None or c.error is not None or math.isnan(c.analytic_tokens_per_s):
            return -math.inf
        return c.analytic_tokens_per_s

    def evaluate(self, settings: Iterable[dict[str, Any]]) -> None:
        todo = {canonical_json(k): k for k in settings if canonical_json(k) not in self.analytic}
        if not todo:
            return
        rows = self._run(list(todo.values()), "analytic")
        for key, knobs in todo.items():
            config, row = rows[key]
            self.analytic[key] = Candidate(knobs, config, analytic_tokens_per_s=_metric(row, "decode_tokens_per_s"),
                                           error=row.get("error"))

    def confirm(self, settings: list[dict[str, Any]]) -> list[Candidate]:
        rows = self._run(settings, "des")
        out = []
        for knobs in settings:
            key = canonical_json(knobs)
            config, row = rows[key]
            prior = self.analytic.get(key)
            out.append(Candidate(knobs, config,
                                 analytic_tokens_per_s=prior.analytic_tokens_per_s if prior else math.nan,
                                 tokens_per_s=_metric(row, "decode_tokens_per_s"),
                                 energy_j_per_token=_metric(row, "energy_j_per_token"), error=row.get("error")))
        return out

    def _run(self, knob_sets: list[dict[str, Any]], mode: str) -> dict[str, tuple[RunConfig | None, dict[str, Any]]]:
        """(configuration, row) by knob key; settings that resolve to one configuration run once."""
        points: dict[str, Point] = {}
        keys_of: dict[str, list[str]] = {}
        configs: dict[str, RunConfig | None] = {}
        rows: dict[str, dict[str, Any]] = {}
        for knobs in knob_sets:
            key = canonical_json(knobs)
            configs[key] = None
            try:
                configs[key] = _candidate(self.base, knobs, mode, self.tokens[mode])
                task = _task(configs[key], self.calibration)
            except SimError as exc:
                rows[key] = {"status": "failed", "error": str(exc)}
                continue
            points.setdefault(task["id"], Point(task["id"], {}, task, columns=config_columns(task)))
            keys_of.setdefault(task["id"], []).append(key)
        for row in run_points(self.ex, list(points.values())):
            for key in keys_of[row["point_id"]]:
                rows[key] = row
        return {key: (configs[key], rows[key]) for key in configs}


def _metric(row: dict[str, Any], name: str) -> float:
    if row.get("status") != "ok":
        return math.nan
    v = row.get(name)
    return float(v) if v is not None else math.nan
