"""Up-front checks of a sweep's points: bad input stops a sweep before any point runs.

A mistake in a spec (a negative token count, an unknown strategy, a budget and an offload
given together, a profile override out of range) would otherwise fail every point it
touches, one by one, and leave a results file of failures behind an exit status of 0.
:func:`check_points` validates each distinct configuration the way a run does and raises
the first problem as one :class:`SimError` naming the spec file and the spec field
(``fig10.yaml: grid.offload: ...``).

The rules are not copied here: :func:`check_task` calls
:func:`sim.engine.simulation.check_options`, the function ``simulate`` itself starts
with, so every option rule of a run (modes, token counts, seed, weights format, policies,
strategies, knobs, cores, the memory options) is a rule of the sweep too; then it opens
the point's trace the way ``simulate`` does (a preset's name, a file's shape and length).

Capacity is deliberately not checked: a budget too small for the model, or above the
device's usable DRAM, is a legitimate infeasible point of a sweep. Those points run, are
recorded as failed rows, and make ``sim sweep`` exit with status 1.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.errors import SimError
from sim.explore.resolve import OVERRIDES_SUFFIX, canonical_json
from sim.explore.spec import Point
from sim.explore.worker import error_text
from sim.profiles.edits import PATH_ERROR, SettingError
from sim.traces.format import Trace

# Bytes of DRAM and of budget no model comes near: with them, capacity never decides a check.
ROOMY_BYTES = 2**60

# Engine option -> the settings that can cause its error, most likely first (``--offload``:
# "give either a memory budget or an offload fraction" names the offload, but the budget
# may be the one the spec varies).
_RELATED: dict[str, tuple[str, ...]] = {
    "offload": ("offload", "memory_budget"),
    "memory_budget": ("memory_budget", "offload"),
    "strategy": ("strategy", "memory_budget", "offload", "policy"),
    "policy": ("policy", "strategy"),
    "preset": ("preset", "model"),
    "trace": ("trace", "preset"),
    "decode_tokens": ("decode_tokens", "warmup_tokens", "profile_tokens", "prompt_tokens", "trace"),
    "context_tokens": ("prompt_tokens", "decode_tokens"),
    "compute_cores": ("knobs.compute_cores", "knobs.io_cores"),
    "io_cores": ("knobs.io_cores", "knobs.compute_cores"),
}
# Error sources that name no file of the user's (so the message need not repeat them).
_NOT_FILES = ("knobs", "--set", PATH_ERROR)


def check_points(points: list[Point], source: str) -> None:
    """Raise the first problem of any point as one SimError naming ``source`` and the spec field.

    Points that share everything a check looks at (most of a budget axis, say) are checked
    once, so a large sweep is checked in a fraction of the time its first point takes.
    """
    checked: set[str] = set()
    for point in points:
        if point.failure is not None:
            raise spec_error(point, point.failure, source)
        key = _check_key(point.task)
        if key in checked:
            continue
        try:
            check_task(point.task)
        except SimError as exc:
            raise spec_error(point, exc, source) from None
        except Exception as exc:  # an input the engine does not expect: still one line, naming the point
            raise spec_error(point, SimError(error_text(exc)), source) from None
        checked.add(key)


def check_task(task: dict[str, Any], *, capacity: bool = False) -> None:
    """Raise the SimError a run of ``task`` would raise for its options, without simulating.

    By default the device gets room for any budget, so the check never fails for capacity
    (a sweep's infeasible points are results, see the module docstring); ``capacity=True``
    checks the budget against the real device too (the planner, whose one budget must
    fit). Everything else goes through ``check_options`` as a run would.
    """
    from sim.engine.simulation import check_options
    from sim.explore.resolve import run_config
    from sim.profiles.device import DeviceProfile
    from sim.profiles.model import ModelProfile

    device = DeviceProfile.model_validate(task["device"] if capacity else _roomy(task["device"]))
    model = ModelProfile.model_validate(task["model"])
    run = task["run"] if capacity else _relaxed_run(task["run"])
    check_options(run_config(task, device, model, run))
    _check_trace(task, model)


def spec_error(point: Point, exc: SimError, source: str) -> SimError:
    """``exc`` restated for the spec: ``<spec file>: <spec field>: <what is wrong>``."""
    keys = _culprits(exc)
    field = _spec_field(point, keys)
    return SimError(_detail(exc, keys[0] if keys else ""), source=source, field=field)


def _check_key(task: dict[str, Any]) -> str:
    """What a check of ``task`` depends on: the budget's value does not matter (only whether one is given)."""
    inputs = {k: task[k] for k in ("device_hash", "model_hash", "strategy", "knobs", "trace")}
    return canonical_json({**inputs, "run": _relaxed_run(task["run"])})


def _roomy(device: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(device)
    data["dram"].update(total_bytes=ROOMY_BYTES, usable_bytes=ROOMY_BYTES)
    return data


def _relaxed_run(run: dict[str, Any]) -> dict[str, Any]:
    out = dict(run)
    if out.get("memory_budget") is not None:  # given: its value was parsed when the point resolved
        out["memory_budget"] = ROOMY_BYTES
    return out


def _check_trace(task: dict[str, Any], model: Any) -> None:
    """What ``simulate`` checks once it opens its trace: the preset, a file's shape and length."""
    from sim.engine.simulation import resolve_trace
    from sim.traces.derived import preset_for

    run, trace = task["run"], task["trace"]
    if "file" in trace:
        needed = (run["profile_tokens"] or 0) + run["warmup_tokens"] + run["decode_tokens"]
        resolve_trace(model, Trace.load(trace["file"]), None, needed, run["seed"])  # reads the metadata only
    else:
        preset_for(trace["preset"], model, hint="(or use a trace file)")


def _culprits(exc: SimError) -> list[str]:
    """The settings that may have caused ``exc``, most likely first."""
    if isinstance(exc, SettingError):
        return [exc.key]
    field = exc.field or ""
    if field.startswith("knobs."):
        return [field]
    if field.startswith("meta."):  # a trace file of another model's shape
        return ["trace", "model"]
    keys: list[str] = []
    for part in field.split("/"):  # e.g. --prompt-tokens/--decode-tokens
        name = part.strip().lstrip("-").replace("-", "_")
        keys += [k for k in _RELATED.get(name, (name,)) if k not in keys]
    return [k for k in keys if k]


def _spec_field(point: Point, keys: list[str]) -> str:
    """Where the spec sets the first of ``keys`` this point has (``grid.offload``, ``base.knobs.x``)."""
    for key in keys:
        if key in point.origins:
            return point.origins[key]
        if key.startswith("knobs.") and "knobs" in point.origins:
            return f"{point.origins['knobs']}.{key.split('.', 1)[1]}"
    # A setting the spec leaves at its default (a default that does not suit the rest):
    # name the setting, and the point by its axis values.
    axes = ", ".join(f"{k}={v}" for k, v in point.axes.items())
    return f"{keys[0] if keys else 'base'}" + (f" (at {axes})" if axes else "")


def _detail(exc: SimError, key: str) -> str:
    """The message, with the error's own file and field when they add to the spec field."""
    where = []
    if exc.source and exc.source not in _NOT_FILES and not exc.source.endswith(OVERRIDES_SUFFIX):
        where.append(exc.source)  # a profile or trace file the spec refers to
    field = exc.field or ""
    if field and not field.startswith("--") and field not in (key, "(top level)") \
            and not key.endswith(f".{field}") and not key.startswith(f"{field}."):
        where.append(field)
    return ": ".join([*where, exc.detail])
