"""The offline planner: the PowerInfer-2 knobs that run a model fastest on a device at a budget.

[PI2 §5.3]'s planner takes the device's profiles and the user's memory limit and chooses
the compute threads and their cores, the I/O core, the neuron-cluster size and the
hot/cold split (the paper solves its cost model with an SMT solver). Here the cost model
is the engine's own analytic mode, and the search is explicit:

1. **Prune** with the analytic mode on a short stretch of the trace. Starting from the
   default configuration, each pass evaluates, as one parallel batch, every change of a
   single knob family (core layout, hot-region share, cold-region policy, cluster size,
   NPU share, and whether the GPU runs that share), then the best value of every family
   combined (families interact, so the combination is evaluated too, not assumed); the
   best setting seen starts the next pass.
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
from sim.errors import SimError
from sim.explore.executors import Executor, make_executor
from sim.explore.resolve import canonical_json, config_columns, resolve_settings
from sim.explore.spec import Point
from sim.explore.sweep import run_points
from sim.profiles.device import DeviceProfile

OBJECTIVES = ("tokens_per_s", "energy")
SEARCHED = ("compute_cores", "io_cores", "cluster_neurons", "npu_activation_share", "hot_share", "policy", "hot_unit")
HOT_SHARES = (0.25, 0.5, 0.75, 1.0)
POLICIES = ("lru", "s3fifo")
CLUSTER_SIZES = (256, 512, 1024, 2048)  # [PI2 §4.2] uses 512; smaller ones lose on overhead
NPU_SHARES = (0.0, 0.25, 0.5, 0.75)


@dataclass
class Candidate:
    """One knob setting and what it measured."""

    knobs: dict[str, Any]  # searched knobs that differ from the strategy's defaults
    analytic_tokens_per_s: float = math.nan
    tokens_per_s: float = math.nan  # DES (NaN when not confirmed)
    energy_j_per_token: float = math.nan
    error: str | None = None

    @property
    def key(self) -> str:
        return canonical_json(self.knobs)


@dataclass
class PlanResult:
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
            "strategy": "powerinfer2",
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
        flags = (f" --decode-tokens {tokens}" if tokens is not None else "") + \
            (f" --warmup-tokens {warmup}" if warmup != 16 else "") + (f" --seed {seed}" if seed else "")
        head = (f"# sim plan: {self.model} on {self.device} at memory budget {self.memory_budget} "
                f"(objective {self.objective})\n"
                f"# use it: sim run --device {refs['device']} --model {refs['model']} "
                f"--memory-budget {self.memory_budget}{f' --preset {preset}' if preset else ''}{flags}{sets} "
                "--plan PLAN.yaml\n") + note
        return head + yaml.dump(self.plan_mapping(), Dumper=_PlanDumper, sort_keys=False, default_flow_style=False)


class _PlanDumper(yaml.SafeDumper):
    """Block mappings, but core lists on one line (``[big, mid-hi, mid-hi]``)."""


_PlanDumper.add_representer(list, lambda d, v: d.represent_sequence(
    "tag:yaml.org,2002:seq", v, flow_style=all(not isinstance(x, dict | list) for x in v)))


def _round(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(f"{v:.6g}")


def core_layouts(device: DeviceProfile) -> list[dict[str, Any]]:
    """Thread layouts worth trying: the strategy default, then one I/O core per speed class.

    The I/O thread runs on a core of its own ([PI2 §5]); 4 KiB reads are as fast as the
    issuing core ([PI2 §2.3]), so for each distinct I/O speed the cluster whose cores
    compute slowest gives up one core, and the slowest (little) cluster either computes
    too or stays out.
    """
    clusters = device.cpu.clusters
    slowest = min(clusters, key=lambda c: c.int8_gops)
    by_speed: dict[float, Any] = {}
    for c in clusters:
        cur = by_speed.get(c.io_4k_gbps)
        if cur is None or c.int8_gops < cur.int8_gops:
            by_speed[c.io_4k_gbps] = c
    layouts: list[dict[str, Any]] = [{}]
    seen: set[str] = set()
    for io in sorted(by_speed.values(), key=lambda c: -c.io_4k_gbps):
        for with_slowest in (False, True):
            compute: list[str] = []
            for c in clusters:
                if c is slowest and not with_slowest and c is not io:
                    continue
                n = c.cores - (1 if c is io else 0)
                if c is slowest and not with_slowest:
                    n = 0
                compute += [c.name] * n
            key = canonical_json([compute, io.name])
            if compute and key not in seen:
                seen.add(key)
                layouts.append({"compute_cores": compute, "io_cores": [io.name]})
    return layouts


def search_space(device: DeviceProfile) -> list[tuple[str, list[dict[str, Any]]]]:
    """Knob families in search order, each a list of partial knob settings."""
    return [
        ("cores", core_layouts(device)),
        ("hot_share", [{"hot_share": v} for v in HOT_SHARES]),
        ("policy", [{"policy": v} for v in POLICIES]),
        ("cluster_neurons", [{"cluster_neurons": v} for v in CLUSTER_SIZES]),
        ("npu_activation_share",
         [{"npu_activation_share": v} for v in (NPU_SHARES if device.npu or device.gpu else (0.0,))]),
        # the accelerator for that share: the NPU (None, the default) or the GPU, which on a
        # phone without an NPU is the only one (the default then leaves the share on the CPU)
        ("hot_unit", [{"hot_unit": v} for v in ([None, "gpu"] if device.gpu else [None])]),
    ]


def plan(device: str | DeviceProfile = "oneplus-12", model: str = "turbosparse-mixtral-47b", *,
         memory_budget: Any = None, objective: str = "tokens_per_s", min_tokens_per_s: float | None = None,
         prune_tokens: int = 8, confirm_tokens: int = 32, warmup_tokens: int = 16, confirm: int = 3,
         passes: int = 2, seed: int = 0, preset: str | None = None, workers: int = 1,
         executor: Executor | None = None) -> PlanResult:
    """Search the PowerInfer-2 knobs for ``model`` on ``device`` at ``memory_budget``."""
    from sim.engine.strategies import get_strategy
    from sim.explore.point_checks import check_task
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
    dev = load_device(device)
    if objective == "energy" and dev.power is None:
        raise SimError(f"{dev.name}'s profile has no power figures, so energy per token is unknown; add a power "
                       "section or plan for tokens_per_s", field="--objective")
    # a name stays a name (the plan file names it); a path, a mapping or an object is the profile itself
    base = {"device": device if isinstance(device, str) else dev,
            "model": model if isinstance(model, str) else load_model(model), "strategy": "powerinfer2",
            "memory_budget": memory_budget, "warmup_tokens": warmup_tokens, "seed": seed, "preset": preset}
    # Every run option, the trace and the budget's room, as `sim run` checks them, for both kinds of
    # evaluation (pruning and confirming), before the search starts.
    tasks = []
    evaluations = (("analytic", prune_tokens, "--prune-tokens"), ("des", confirm_tokens, "--confirm-tokens"))
    for mode, tokens, flag in evaluations:
        task = _resolve({**base, "mode": mode, "decode_tokens": tokens}, {})
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
        search = _Search(ex, base, prune_tokens)
        current: dict[str, Any] = {}
        space = search_space(dev)
        for _ in range(passes):
            # One batch: every single-family change of the current setting (parallel-friendly).
            trials = [current] + [_merge(current, opt) for _family, options in space for opt in options]
            search.evaluate(trials)
            # Then the best value of each family together (families interact, so it is checked).
            combined = dict(current)
            for _family, options in space:
                best_opt = max(options, key=lambda o: search.score(_merge(current, o)))
                if search.score(_merge(current, best_opt)) > search.score(current):
                    combined = _merge(combined, best_opt)
            search.evaluate([combined])
            best = max(search.analytic.values(), key=lambda c: search.score(c.knobs)).knobs
            if canonical_json(best) == canonical_json(current):
                break
            current = best
        ranked = sorted((c for c in search.analytic.values() if c.error is None and c.knobs != {}),
                        key=lambda c: -c.analytic_tokens_per_s)
        shortlist = [c.knobs for c in ranked[:confirm]] + [{}]  # the default is always confirmed too
        confirmed = search.confirm(shortlist, confirm_tokens)
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
    resolved = _spell_out(best.knobs, base_task, get_strategy("powerinfer2"), dev)
    settings = {"decode_tokens": confirm_tokens, "warmup_tokens": warmup_tokens, "seed": seed,
                "prune_tokens": prune_tokens, **({"preset": preset} if preset else {})}
    def named(ref: Any, name: str) -> str:  # what a command line gives: the name, or the file's path
        return ref if isinstance(ref, str) else str(ref) if isinstance(ref, Path) else name

    return PlanResult(named(device, dev.name), named(model, base_task["model"]["name"]), memory_budget, objective,
                      best, default, runners,
                      resolved, len(search.analytic), len(confirmed), settings,
                      profile_hashes={"device": base_task["device_hash"], "model": base_task["model_hash"]},
                      given_as_objects=tuple(kind for kind, ref in (("device", device), ("model", model))
                                             if not isinstance(ref, str | Path)))


def _energy(c: Candidate) -> float:
    return c.energy_j_per_token if not math.isnan(c.energy_j_per_token) else math.inf


def _merge(current: dict[str, Any], option: dict[str, Any]) -> dict[str, Any]:
    merged = dict(current)
    if "compute_cores" in option or option == {}:  # a core layout replaces the previous one
        merged.pop("compute_cores", None)
        merged.pop("io_cores", None)
    merged.update(option)
    return _drop_defaults(merged)


_DEFAULTS: dict[str, Any] = {}


def _drop_defaults(knobs: dict[str, Any]) -> dict[str, Any]:
    """Knobs equal to the strategy default are left out, so one setting has one spelling."""
    if not _DEFAULTS:
        from sim.engine.strategies.powerinfer2 import PowerInfer2Knobs

        _DEFAULTS.update(PowerInfer2Knobs().model_dump())
    return {k: v for k, v in knobs.items() if _DEFAULTS.get(k, object()) != v}


def _resolve(settings: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    """The task for ``settings``; a bad setting is reported under the ``sim plan`` flag that set it."""
    try:
        return resolve_settings({**settings, "knobs": dict(knobs)})
    except SimError as exc:
        if exc.field and not exc.field.startswith("-") and exc.field in settings:
            raise SimError(exc.detail, source=exc.source, field="--" + exc.field.replace("_", "-")) from None
        raise


def _describe(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "default configuration"


def _spell_out(knobs: dict[str, Any], base_task: dict[str, Any], strategy_cls: Any,
               dev: DeviceProfile) -> dict[str, Any]:
    """Every searched knob with its value, default core layout included (a self-contained plan)."""
    from sim.profiles.device import DeviceProfile as Dev
    from sim.profiles.memory import plan_memory
    from sim.profiles.model import ModelProfile

    full = {**_DEFAULTS, **knobs}
    if full.get("compute_cores") is None or full.get("io_cores") is None:
        run = base_task["run"]
        mem = plan_memory(ModelProfile.model_validate(base_task["model"]), Dev.model_validate(base_task["device"]),
                          budget=run["memory_budget"], offload=run["offload"], weights_dtype=run["weights_dtype"],
                          context_tokens=run["prompt_tokens"] + run["decode_tokens"],
                          predictor=strategy_cls.uses_predictor, split_scales=strategy_cls.split_scales)
        compute, io = strategy_cls.default_cores(dev, needs_io=mem.offload_fraction > 0)
        full["compute_cores"] = full.get("compute_cores") or list(compute)
        full["io_cores"] = full.get("io_cores") or list(io)
    if full.get("hot_unit") is None and dev.npu is not None:
        full["hot_unit"] = "npu"  # what the default means on this phone, spelled out
    return {k: full[k] for k in SEARCHED}


class _Search:
    """Evaluations so far, by knob setting (nothing is simulated twice)."""

    def __init__(self, ex: Executor, base: dict[str, Any], prune_tokens: int):
        self.ex = ex
        self.base = base
        self.prune_tokens = prune_tokens
        self.analytic: dict[str, Candidate] = {}

    def score(self, knobs: dict[str, Any]) -> float:
        c = self.analytic.get(canonical_json(knobs))
        if c is None or c.error is not None or math.isnan(c.analytic_tokens_per_s):
            return -math.inf
        return c.analytic_tokens_per_s

    def evaluate(self, settings: Iterable[dict[str, Any]]) -> None:
        todo = {canonical_json(k): k for k in settings if canonical_json(k) not in self.analytic}
        if not todo:
            return
        rows = self._run(list(todo.values()), {"mode": "analytic", "decode_tokens": self.prune_tokens})
        for key, knobs in todo.items():
            row = rows[key]
            self.analytic[key] = Candidate(knobs, analytic_tokens_per_s=_metric(row, "decode_tokens_per_s"),
                                           error=row.get("error"))

    def confirm(self, settings: list[dict[str, Any]], tokens: int) -> list[Candidate]:
        rows = self._run(settings, {"mode": "des", "decode_tokens": tokens})
        out = []
        for knobs in settings:
            key = canonical_json(knobs)
            row = rows[key]
            prior = self.analytic.get(key)
            out.append(Candidate(knobs, analytic_tokens_per_s=prior.analytic_tokens_per_s if prior else math.nan,
                                 tokens_per_s=_metric(row, "decode_tokens_per_s"),
                                 energy_j_per_token=_metric(row, "energy_j_per_token"), error=row.get("error")))
        return out

    def _run(self, knob_sets: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Rows by knob key; settings that resolve to one configuration run once."""
        points: dict[str, Point] = {}
        keys_of: dict[str, list[str]] = {}
        rows: dict[str, dict[str, Any]] = {}
        for knobs in knob_sets:
            key = canonical_json(knobs)
            try:
                task = _resolve({**self.base, **run}, knobs)
            except SimError as exc:
                rows[key] = {"status": "failed", "error": str(exc)}
                continue
            points.setdefault(task["id"], Point(task["id"], {}, task, columns=config_columns(task)))
            keys_of.setdefault(task["id"], []).append(key)
        for row in run_points(self.ex, list(points.values())):
            for key in keys_of[row["point_id"]]:
                rows[key] = row
        return rows


def _metric(row: dict[str, Any], name: str) -> float:
    if row.get("status") != "ok":
        return math.nan
    v = row.get(name)
    return float(v) if v is not None else math.nan
