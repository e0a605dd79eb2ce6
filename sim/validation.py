"""Published figures versus what the simulator predicts for the same setting.

Points live in ``validation/published.yaml`` with their source (paper, table or
figure) and the run options that reproduce the setting. They are used only to check
predictions: no profile number or strategy default is fitted to them.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from sim.bundled import bundled_dir
from sim.checks import check_int
from sim.engine.config import DEFAULT_DECODE_TOKENS, RunConfig
from sim.errors import SimError
from sim.lru import kept
from sim.profiles.yamlio import load_yaml_text

# The run options a point may set (RunConfig's fields); `sim validate` sets the token counts and
# the seed, and a point's knobs (and a speedup's baseline_knobs) are given on their own.
RUN_KEYS = tuple(k for k in RunConfig.model_fields if k not in ("knobs", "decode_tokens", "warmup_tokens", "seed"))
DEFAULT_TOLERANCE = 0.15
SPEEDUP = "speedup"  # the point's run against the same run with `baseline_knobs`, or another system's run on
# the same setting (`baseline`: run options, e.g. a strategy and implementation): the mean latency ratio


def published_path() -> str:
    """Where the published points live, as a path a user can open (named in id errors)."""
    return str(bundled_dir("validation") / "published.yaml")


def load_points() -> list[dict[str, Any]]:
    text = (bundled_dir("validation") / "published.yaml").read_text(encoding="utf-8")
    data = load_yaml_text(text, "published.yaml")
    points = data.get("points")
    if not isinstance(points, list):
        raise SimError("expected a list of points", source="published.yaml", field="points")
    for p in points:
        if isinstance(p, dict) and "fitted" in p:
            _check_fitted(p)
    return [_rung_knobs(p) if isinstance(p, dict) and "rung" in p else p for p in points]


def _check_fitted(point: dict[str, Any]) -> None:
    """``fitted: false`` keeps a point out of the calibration's default selection: scored, not
    fitted. Only a point whose ``known_gap`` says why no value inside the priors reaches it may
    say so; a fit to such a point moves the unknowns it reaches to their bounds and informs none."""
    where = f"{point.get('id')}.fitted"
    if not isinstance(point["fitted"], bool):
        raise SimError(f"must be true or false, got {point['fitted']!r}", source="published.yaml", field=where)
    gap = point.get("known_gap")
    if point["fitted"] is False and not (isinstance(gap, str) and gap.strip()):
        raise SimError("false needs a known_gap saying why no value inside the priors reaches the point",
                       source="published.yaml", field=where)


def _rung_knobs(point: dict[str, Any]) -> dict[str, Any]:
    """A point of an ablation ladder names its rung (``rung: window``, on the strategy's ladder
    or the point's ``ladder``) instead of spelling the knobs: they are `sim ablate`'s for that
    rung (:func:`sim.explore.ablation.knobs_for_rung`), so both run the same configuration.
    The point's own ``knobs`` are added; one the rung switches is refused."""
    from sim.engine.strategies import get_strategy
    from sim.explore.ablation import knobs_for_rung

    where = f"{point.get('id')}.rung"
    try:
        rung = knobs_for_rung(get_strategy(point.get("strategy")), point["rung"], point.get("ladder"))
    except SimError as exc:
        raise SimError(exc.detail, source="published.yaml", field=where) from None
    own = point.get("knobs") or {}
    for knob in rung:
        if knob in own:
            raise SimError(f"knob {knob} is the rung's to set; drop it from knobs", source="published.yaml",
                           field=where)
    return {**point, "knobs": {**rung, **own}}


def metric_value(summary: dict[str, Any], metric: str) -> float:
    """Read ``metric`` from a run summary.

    ``phase_ms.X`` reads one phase's ms per token and ``memory.X`` one DRAM component's
    bytes; ``X+Y`` after the prefix sums several (e.g. all compute phases of a token).
    """
    for prefix, key, what in (("phase_ms.", "phases_ms_per_token", "phase"), ("memory.", "memory", "component")):
        if metric.startswith(prefix):
            table = summary[key]
            total = 0.0
            for name in metric[len(prefix):].split("+"):
                if name not in table:
                    raise SimError(f"the run has no {what} {name!r}; it has: {', '.join(table)}", field="metric")
                total += float(table[name])
            return total
    value = summary.get(metric)
    if value is None:
        raise SimError(f"the run summary has no {metric!r}", field="metric")
    return float(value)


def baseline_run(point: Mapping[str, Any]) -> dict[str, Any] | None:
    """The other system's run a speedup point is compared with when it names one (``baseline:``,
    run options such as a strategy and implementation), as a point-like mapping: the point's
    setting with the baseline's options in place of its own strategy, implementation and knobs.
    None for a point without one."""
    baseline = point.get("baseline")
    if not isinstance(baseline, Mapping):
        return None
    own = {k: v for k, v in point.items() if k not in ("baseline", "knobs", "implementation")}
    return {**own, **baseline}


def _run_options(run: Mapping[str, Any], overrides: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A run's knobs and its other run options, each as ``overrides`` replaces them."""
    options = {**{k: run[k] for k in RUN_KEYS if k in run}, **{k: v for k, v in overrides.items() if k != "knobs"}}
    return overrides.get("knobs", run.get("knobs")), options


def run_point(point: dict[str, Any], *, decode_tokens: int = DEFAULT_DECODE_TOKENS, warmup_tokens: int = 16,
              seed: int = 0, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """One point's prediction; ``overrides`` replaces run options (a calibration's edits,
    :func:`sim.calibrate.apply.run_overrides`), the knobs among them, and its ``baseline`` entry
    those of the other system's run of a point that compares two (``baseline:`` in published.yaml)."""
    overrides = dict(overrides or {})
    baseline_overrides = dict(overrides.pop("baseline", None) or {})
    knobs, kwargs = _run_options(point, overrides)
    other = baseline_run(point)
    if point["metric"] == SPEEDUP and not isinstance(point.get("baseline_knobs"), dict) and other is None:
        raise SimError(f"point {point['id']!r}: a speedup needs baseline_knobs or baseline (the run it is faster "
                       "than)", source="published.yaml", field="baseline")

    def config(knobs: Any, run: dict[str, Any] | None = None) -> RunConfig:  # a point is a run configuration
        return RunConfig.of(source=f"published.yaml: {point['id']}", decode_tokens=decode_tokens,
                            warmup_tokens=warmup_tokens, seed=seed, knobs=knobs, **(kwargs if run is None else run))

    # a DRAM breakdown (kind: memory) is `sim memory`'s plan, no run needed
    summary = {"memory": _memory_summary(kwargs)} if point.get("kind") == "memory" else _summary(config(knobs))
    if point["metric"] == SPEEDUP:  # a paper's "N x faster than <baseline>": latency ratio of two runs
        if other is not None:  # another system on the same setting ([PI2] §7.2.3's "1.84x LLM in a Flash")
            baseline = _summary(config(*_run_options(other, baseline_overrides)))
        else:
            baseline = _summary(config({**(knobs or {}), **point["baseline_knobs"]}))
        summary = {SPEEDUP: baseline["latency_ms_mean"] / summary["latency_ms_mean"]}
    predicted = metric_value(summary, point["metric"])
    published = float(point["published"])
    error = (predicted - published) / published
    tol = float(point.get("tolerance", DEFAULT_TOLERANCE))
    return {"id": point["id"], "source": point["source"], "device": point["device"], "model": point["model"],
            "strategy": point["strategy"],
            "setting": point.get("memory_budget") or (f"offload {point['offload']}" if "offload" in point else ""),
            "metric": point["metric"], "published": published, "predicted": predicted, "error_pct": 100 * error,
            "within_tolerance": abs(error) <= tol, "tolerance_pct": 100 * tol,
            "required": bool(point.get("required", True))}


# Run summaries by configuration: points that differ only in their metric ([FLASH] Table 3's
# total, I/O, memory management and compute; a speed and its miss rate) share one run, in a
# validation and in each evaluation of a fit. An entry keeps its configuration, so an
# in-memory trace it names (hashed by identity) stays alive and its id cannot be reused.
_SUMMARIES: OrderedDict[str, tuple[RunConfig, dict[str, Any]]] = OrderedDict()
SUMMARY_CACHE = 16


def _summary(config: RunConfig) -> dict[str, Any]:
    from sim.engine.simulation import simulate

    entry = kept(_SUMMARIES, config.run_id(length=64), lambda: (config, simulate(config).summary), SUMMARY_CACHE)
    return copy.deepcopy(entry[1])


def _memory_summary(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The memory plan `sim memory` prints for a point's device, model, strategy and budget."""
    from sim.engine.strategies import get_strategy
    from sim.profiles.edits import apply_overrides
    from sim.profiles.memory import plan_memory
    from sim.profiles.registry import load_device, load_model

    strat = get_strategy(kwargs.get("strategy", "powerinfer2"))
    edits = kwargs.get("overrides") or {}  # the point's profile edits, as its runs apply them
    plan = plan_memory(load_model(apply_overrides("model", kwargs["model"], edits)),
                       load_device(apply_overrides("device", kwargs["device"], edits)),
                       budget=kwargs.get("memory_budget"), offload=kwargs.get("offload"),
                       weights_dtype=kwargs.get("weights_dtype"),
                       predictor=strat.uses_predictor, split_scales=strat.split_scales)
    return {**plan.resident, "neuron_cache": plan.neuron_cache_bytes, "unused": plan.unused_bytes}


# Row status (the ``status`` column): a prediction, a run that raised, or a figure kept for the record.
OK, FAILED, NOT_MODELLED = "ok", "failed", "not modelled"
COLUMNS = ["id", "source", "device", "model", "strategy", "metric", "setting", "published", "predicted",
           "error_pct", "within_tolerance", "tolerance_pct", "required", "modelled", "status", "error", "known_gap"]


def check_ids(ids: list[str] | None, points: list[dict[str, Any]] | None = None) -> None:
    """Refuse unknown point ids before anything runs.

    A typo would otherwise select nothing (an empty table) or be silently dropped next
    to a valid id, and the user would believe the point was checked.
    """
    if not ids:
        return
    known = [str(p["id"]) for p in (load_points() if points is None else points)]
    unknown = list(dict.fromkeys(i for i in ids if i not in known))
    if not unknown:
        return
    close = [m for i in unknown for m in difflib.get_close_matches(i, known, n=2)]
    hint = f" (did you mean {', '.join(dict.fromkeys(close))}?)" if close else ""
    what = "unknown point id" if len(unknown) == 1 else "unknown point ids"
    raise SimError(f"{what} {', '.join(map(repr, unknown))}{hint}; ids: {', '.join(known)}",
                   source=published_path(), field="point id")


def check_decode_tokens(decode_tokens: int) -> int:
    """Refuse a token count no run accepts before the table starts (memory points would pass)."""
    return check_int(decode_tokens, "--decode-tokens", 1, None)


def validate(ids: list[str] | None = None, *, decode_tokens: int = DEFAULT_DECODE_TOKENS,
             on_error: str = "record") -> pd.DataFrame:
    """Run every published point (or those named) and return one row per point.

    ``status`` says what a row holds: ``ok`` (a prediction), ``failed`` (the run raised;
    ``error`` says why) or ``not modelled`` (kept for the record; ``error`` gives the reason).
    ``known_gap`` carries the point's note of why the prediction is known to be off (None for
    a point held to its tolerance), so a table read alone says which misses are understood.
    Unknown ids and a bad ``decode_tokens`` raise :class:`SimError` before any point runs.
    """
    if on_error not in ("record", "raise"):
        raise SimError(f"must be 'record' or 'raise', got {on_error!r}", field="on_error")
    if isinstance(ids, str):  # one id, not its characters
        ids = [ids]
    elif ids is not None and (isinstance(ids, bytes) or not isinstance(ids, Iterable)):
        raise SimError(f"expected point ids (a string or a list of them), got {type(ids).__name__}", field="ids")
    elif ids is not None:
        ids = list(ids)
        if not ids:
            raise SimError("no point ids given; pass None for every point", field="point id")
        if not all(isinstance(i, str) for i in ids):
            raise SimError(f"point ids are strings, got {ids!r}", field="point id")
    points = load_points()
    check_ids(ids, points)
    decode_tokens = check_decode_tokens(decode_tokens)
    rows = []
    for point in points:
        if ids and point["id"] not in ids:
            continue
        rows.append({**_point_row(point, decode_tokens, on_error), "known_gap": point.get("known_gap")})
    # Every table has the same columns (``error`` is empty when every point ran), so callers can index them.
    df = pd.DataFrame(rows)
    return df.reindex(columns=[*COLUMNS, *[c for c in df.columns if c not in COLUMNS]])


def _point_row(point: dict[str, Any], decode_tokens: int, on_error: str) -> dict[str, Any]:
    """One point's row: its prediction, the failure (``on_error="record"``) or why it is not modelled."""
    if point.get("modelled") is False:  # a published figure kept for the record, with the reason
        return {"id": point["id"], "source": point["source"], "device": point.get("device", ""),
                "model": point.get("model", ""), "strategy": point.get("strategy", ""),
                "metric": point["metric"], "setting": point.get("setting", ""),
                "published": float(point["published"]), "predicted": float("nan"),
                "error_pct": float("nan"), "within_tolerance": False,
                "error": f"not modelled: {point['why']}", "tolerance_pct": float("nan"),
                "required": False, "modelled": False, "status": NOT_MODELLED}
    try:
        row = run_point(point, decode_tokens=decode_tokens)
        if not math.isfinite(row["predicted"]):  # no number to compare: a failure, not an error of nan%
            raise SimError(f"the run gave {row['predicted']} for {point['metric']!r}", field="metric")
        return {**row, "modelled": True, "status": OK}
    except SimError as exc:
        if on_error == "raise":
            raise
        return {"id": point["id"], "source": point["source"], "device": point["device"],
                "model": point["model"], "strategy": point["strategy"], "metric": point["metric"],
                "setting": point.get("memory_budget") or (
                    f"offload {point['offload']}" if "offload" in point else ""),
                "published": float(point["published"]), "predicted": float("nan"),
                "error_pct": float("nan"), "within_tolerance": False, "error": str(exc),
                "tolerance_pct": 100 * float(point.get("tolerance", DEFAULT_TOLERANCE)),
                "required": bool(point.get("required", True)), "modelled": True, "status": FAILED}


def point_budget_bytes(point: dict[str, Any], *, context_tokens: int = 128) -> int:
    """The DRAM budget of a point: its ``memory_budget``, or what its ``offload`` implies.

    An offload fraction becomes a budget through the same memory plan the run uses (the
    strategy decides whether predictors and separate scales are resident), so published
    "50% of FFN offloaded" points can sit on a tokens/s-vs-budget axis.
    """
    from sim.engine.strategies import get_strategy
    from sim.profiles.memory import plan_memory
    from sim.profiles.registry import load_device, load_model
    from sim.units import parse_bytes

    if point.get("memory_budget") is not None:
        return parse_bytes(point["memory_budget"], source="published.yaml", field=f"{point['id']}.memory_budget")
    strat = get_strategy(point["strategy"])
    plan = plan_memory(load_model(point["model"]), load_device(point["device"]), offload=point.get("offload"),
                       weights_dtype=point.get("weights_dtype"), context_tokens=context_tokens,
                       predictor=strat.uses_predictor, split_scales=strat.split_scales)
    return plan.budget_bytes


def published_frame(*, metric: str | None = "decode_tokens_per_s", device: str | None = None,
                    model: str | None = None) -> pd.DataFrame:
    """Published points as a tidy frame (one row per point) with their budget in bytes.

    Filters by metric, device and model when given; ``setting`` says how the paper stated
    the memory (``7GB`` or ``offload 0.5``). Used to overlay published figures on plots.
    """
    rows = []
    for point in load_points():
        if point.get("modelled") is False or point.get("kind") == "memory":
            continue  # no run setting to place on a budget axis
        if (metric and point["metric"] != metric) or (device and point["device"] != device) or (
                model and point["model"] != model):
            continue
        setting = point.get("memory_budget") or (f"offload {point['offload']}" if "offload" in point else "")
        rows.append({"id": point["id"], "source": point["source"], "device": point["device"], "model": point["model"],
                     "strategy": point["strategy"], "metric": point["metric"], "published": float(point["published"]),
                     "setting": setting, "budget_bytes": point_budget_bytes(point),
                     "required": bool(point.get("required", True))})
    columns = ["id", "source", "device", "model", "strategy", "metric", "published", "setting", "budget_bytes",
               "required"]
    return pd.DataFrame(rows, columns=columns)
