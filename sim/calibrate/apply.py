"""Put calibrated values into a published point's run: profile edits, knobs, an edited trace preset.

One mechanism for every kind of unknown: a value reaches the run exactly as a user's
``--set`` would (``model.``/``device.`` field paths, strategy knobs) or, for a trace-preset
field, as the same synthetic trace generated from the edited preset. A value is applied to
a point only where its scope matches the point's model family, implementation, device and
OS, so one number serves every run it describes.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from sim.calibrate.unknowns import Unknown
from sim.errors import SimError
from sim.lru import file_version, kept
from sim.validation import baseline_run

# Traces generated from edited presets, kept while a fit evaluates the same values on many points.
_TRACES: OrderedDict[tuple, Any] = OrderedDict()
TRACE_CACHE = 4
# Presets as read (a bundled file by its size and time, a derived one by its model profile): reading
# and writing their YAML cost more than the evaluation they serve (sim sensitivity's thousands).
_PRESETS: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
PRESET_CACHE = 8
RUN_ID = "run"  # the point-like id of a run configuration (run_facts), not a published point


def scope_facts(point: Mapping[str, Any]) -> dict[str, str | None]:
    """What a scope can match in a point: its model (name, family, FFN activation function),
    implementation, device and OS.

    A point's implementation is its strategy unless it names one (``implementation: ...``,
    e.g. [PI2]'s own port of LLM in a Flash, which is not Apple's program).
    """
    from sim.profiles.registry import load_device, load_model

    facts: dict[str, str | None] = {"implementation": point.get("implementation") or point.get("strategy"),
                                    "device": point.get("device"), "model": None, "model_family": None,
                                    "activation": None, "os": None}
    if point.get("model"):
        profile = load_model(point["model"])
        facts.update(model=profile.name, model_family=profile.family, activation=profile.activation)
    if point.get("device"):
        facts["os"] = getattr(load_device(point["device"]), "os", None)
    return facts


def default_points(points: list[dict[str, Any]], unknowns: list[Unknown]) -> tuple[list[dict[str, Any]], list[str]]:
    """The points a calibration fits when none are named: every modelled point some unknown
    reaches, but those published.yaml marks ``fitted: false`` (whose ``known_gap`` says no value
    inside the priors reaches them), which are returned apart, by id, to be scored, not fitted."""
    reached = [p for p in points if p.get("modelled") is not False and applicable(unknowns, p)]
    return ([p for p in reached if p.get("fitted", True)],
            [str(p["id"]) for p in reached if not p.get("fitted", True)])


def applicable(unknowns: list[Unknown], point: Mapping[str, Any]) -> list[Unknown]:
    """The unknowns whose scope covers ``point``: its own run's or, for a point that compares two
    systems, either run's (a value reaches the point if it reaches one of them)."""
    if point.get("modelled") is False:
        return []
    runs = [point, *filter(None, [baseline_run(point)])]
    facts = [scope_facts(run) for run in runs]
    return [u for u in unknowns if any(u.applies_to(f) for f in facts)]


def _own(unknowns: list[Unknown], run: Mapping[str, Any]) -> list[Unknown]:
    """The unknowns whose scope covers this one run (a baseline's are not its)."""
    return applicable(unknowns, {k: v for k, v in run.items() if k != "baseline"})


def run_overrides(point: Mapping[str, Any], values: Mapping[Unknown, float], *, decode_tokens: int,
                  warmup_tokens: int = 16, seed: int = 0,
                  profile_edits: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Keyword arguments of :func:`sim.engine.simulation.simulate` that put ``values`` into the point's run.

    Only the values whose scope covers the point are used; none gives ``{}`` (the run as
    published.yaml states it). ``profile_edits``: the run's own ``--set`` edits
    (``RunConfig.overrides``; default: the point's own ``overrides``), which the run applies on
    top, so an edited trace is made for the model as the run will see it (``--set
    model.n_layers=16`` a 16-layer trace).
    """
    from sim.profiles.edits import edit_device, edit_model

    chosen = {u: v for u, v in values.items() if u in _own(list(values), point)}
    by_kind: dict[str, dict[str, Any]] = {kind: {} for kind in ("model", "device", "knobs", "preset")}
    for unknown, value in chosen.items():
        by_kind[unknown.kind][unknown.field_path] = int(round(value)) if unknown.integer else float(value)
    out: dict[str, Any] = {}
    if by_kind["model"]:
        out["model"] = edit_model(point["model"], by_kind["model"])
    if by_kind["device"]:
        out["device"] = edit_device(point["device"], by_kind["device"])
    if by_kind["knobs"]:
        out["knobs"] = {**(point.get("knobs") or {}), **by_kind["knobs"]}
    if by_kind["preset"]:
        from sim.profiles.edits import apply_overrides

        edits = point.get("overrides") if profile_edits is None else profile_edits
        model = apply_overrides("model", out.get("model", point["model"]), edits or {})
        out.update(_edited_trace(point, model, by_kind["preset"],
                                 decode_tokens=decode_tokens, warmup_tokens=warmup_tokens, seed=seed))
    baseline = baseline_run(point)
    if baseline is not None:  # the other system's run takes the values in its own scope
        # its own profile edits: the point's, unless the baseline names others (Table 4's `overrides: {}`)
        out["baseline"] = run_overrides(baseline, values, decode_tokens=decode_tokens, warmup_tokens=warmup_tokens,
                                        seed=seed)
    return out


def _edited_trace(point: Mapping[str, Any], model: Any, edits: dict[str, Any], *, decode_tokens: int,
                  warmup_tokens: int, seed: int) -> dict[str, Any]:
    """The point's synthetic trace from its preset with ``edits``, as the run would generate it.

    The run profiles hot neurons on the trace's first tokens exactly as it does on a
    generated preset (the point's ``profile_tokens``, or the run's default), so unedited
    values give the same figures. A point that replays a recorded trace has no preset to edit.
    """
    from sim.engine.simulation import DEFAULT_PROFILE_TOKENS, TRACE_READ_AHEAD
    from sim.engine.trace_replay import replayable
    from sim.profiles.edits import apply_path
    from sim.profiles.registry import load_model
    from sim.traces.params import SynthDims, params_from_mapping
    from sim.traces.store import stored_synth_trace

    if point.get("trace") is not None:
        raise SimError("replays a recorded trace, so a trace-preset unknown cannot reach it; leave it out of "
                       "the unknown's scope", source=str(point.get("id")), field="trace")
    profile = load_model(model)
    name = point.get("preset") or profile.name
    try:
        raw = _preset_raw(name, profile)
    except SimError as exc:
        if point.get("id") == RUN_ID:  # a run's own --preset: its error as the uncalibrated run gives it
            raise
        raise SimError(f"has no trace preset to calibrate: {exc.detail}", source=str(point.get("id")),
                       field="preset") from None
    for path, value in edits.items():
        apply_path(raw, path, value, where=f"preset.{path}")
    profile_tokens = point.get("profile_tokens")
    profile_tokens = DEFAULT_PROFILE_TOKENS if profile_tokens is None else int(profile_tokens)
    n_tokens = profile_tokens + warmup_tokens + decode_tokens
    dims = SynthDims.from_model(profile)
    # the edited mapping names the parameters (they are a function of it)
    key = (json.dumps(raw, sort_keys=True, default=repr), dims, n_tokens, seed)
    # from the trace store (made once across runs and a sweep's workers), its chunks kept in memory: a
    # lazy generated trace would be generated again by every run that reads it
    trace = kept(_TRACES, key, lambda: replayable(stored_synth_trace(
        params_from_mapping(raw, f"{name} (calibrated)"), dims, n_tokens, seed, chunk_tokens=32),
        read_ahead=TRACE_READ_AHEAD), TRACE_CACHE)
    return {"trace": trace, "preset": None, "profile_tokens": profile_tokens}


def _preset_raw(name: str, profile: Any) -> dict[str, Any]:
    """A copy of the mapping of the preset ``name`` for ``profile`` (:func:`~sim.traces.derived.preset_for`)."""
    from sim.traces.derived import preset_for
    from sim.traces.params import PRESET_DIR

    # a bundled file by its version on disk; a derived preset by the profile it is derived from
    key = (name, file_version(PRESET_DIR / f"{name}.yaml") or profile.model_dump_json())
    return copy.deepcopy(kept(_PRESETS, key, lambda: preset_for(name, profile).raw, PRESET_CACHE))


def run_facts(config: Any) -> dict[str, Any]:
    """A run configuration as the point-like mapping :func:`run_overrides` reads: its device,
    model, strategy and implementation (the strategy's own unless the run names one), knobs,
    preset and profile length."""
    from sim.profiles.registry import load_device, load_model

    return {"id": RUN_ID, "device": load_device(config.device).name, "model": load_model(config.model),
            "strategy": config.strategy, "implementation": config.implementation, "knobs": dict(config.knobs),
            "preset": config.preset, "profile_tokens": config.profile_tokens}


def calibrated_config(config: Any, calibration: Any, *, user_paths: tuple[str, ...] = ()) -> Any:
    """``config`` (a :class:`~sim.engine.config.RunConfig`) with ``calibration``'s in-sample values
    that cover it: profile fields edited on its device and model, knobs under the ones the
    user gave, a trace from the edited preset. A value whose field the user set explicitly
    (``user_paths``: ``device.<path>``, ``model.<path>`` or a knob name) is the user's, not
    the calibration's. A run with its own trace keeps it: a preset value has nothing to edit.
    """
    from sim.engine.config import RunConfig

    if calibration is None:
        return config
    from sim.engine.strategies import get_strategy

    facts = run_facts(config)
    activations = get_strategy(config.strategy).reads_activations
    mine = set(user_paths)
    values = {u: v for u, v in calibration.in_sample().items()
              if not ({f"{u.kind}.{u.field_path}", u.field_path} & mine)
              and not (u.kind == "preset" and (config.trace is not None or not activations))}
    over = run_overrides({**facts, "device": config.device, "model": config.model}, values,
                         decode_tokens=config.decode_tokens, warmup_tokens=config.warmup_tokens, seed=config.seed,
                         profile_edits=config.overrides)
    if not over:
        return config
    if "knobs" in over:  # the user's knobs win: the ones they named, or set to other than the default
        from sim.engine.strategies.base import parse_knobs

        defaults = parse_knobs(get_strategy(config.strategy), {}).model_dump(mode="json")
        chosen = {k: v for k, v in dict(config.knobs).items() if k in mine or defaults.get(k, v) != v}
        over["knobs"] = {**dict(config.knobs), **over["knobs"], **chosen}
    options = {name: getattr(config, name) for name in type(config).model_fields}
    return RunConfig.of(**{**options, **over})
