"""Resolving a sweep point's settings into a complete, hashable configuration (a task).

A *setting* key (:func:`classify`) is a run option (a field of :class:`sim.engine.config.RunConfig`),
``knobs.<name>``, or a ``device.``/``model.`` field path (``:scale`` multiplies instead of
replacing). :func:`resolve_settings` applies them: profiles after overrides, every run
option and knob with its default filled in, the trace's file hash and the project
version, whose digest is the point's stable id. :func:`config_columns` turns a task into
the configuration columns of its result row.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sim.code_version import code_digest
from sim.errors import SimError
from sim.profiles.edits import PROFILE_KINDS, SettingError, edited_profile
from sim.profiles.edits import blame as _blame
from sim.units import parse_size_or_percent

# knobs have their own keys (knobs.<name>) and profile edits theirs (device.<path>, model.<path>)
NOT_SETTINGS = ("knobs", "overrides")
# A point's calibration (`sim calibrate --out`, `none`, or absent: the bundled one): not a run
# option but part of the point (its values are in the task, so its id changes with them).
CALIBRATION = "calibration"


def classify(key: str, source: str = "spec", where: str | None = None) -> str:
    """What a setting key addresses: ``run``, ``knob``, ``device`` or ``model``."""
    if not isinstance(key, str):
        raise SimError(f"setting names must be text, got {key!r}", source=source, field=where)
    if key in run_options():
        return "run"
    if key == CALIBRATION:
        return CALIBRATION
    head, _, rest = key.partition(".")
    if head == "knobs" and rest and "." not in rest:
        return "knob"
    if head in PROFILE_KINDS and rest:
        return head
    raise SimError(f"unknown setting {key!r}; use a run option ({', '.join(run_options())}), knobs.<name>, "
                   "device.<field path>, model.<field path> or calibration (a grid axis may also map a name to "
                   "mappings of settings)", source=source, field=where or key)


@functools.lru_cache(maxsize=1)
def run_defaults() -> dict[str, Any]:
    """A run's options and their defaults: :class:`~sim.engine.config.RunConfig`'s fields (never
    copied), so an option the engine gains is a setting (and part of every id) at once."""
    from sim.engine.config import RunConfig

    return {name: value for name, value in RunConfig.defaults().items() if name not in NOT_SETTINGS}


def run_options() -> tuple[str, ...]:
    return tuple(run_defaults())


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str, allow_nan=True)


def digest(value: Any, length: int = 16) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:length]


@functools.lru_cache(maxsize=64)
def file_sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _file_hash(path: Path) -> str:
    st = path.stat()
    return file_sha256(str(path.resolve()), st.st_size, st.st_mtime_ns)


class Resolver:
    """Resolves settings against one spec folder; caches the profiles it loads."""

    def __init__(self, base_dir: Path, source: str):
        self.base_dir = base_dir
        self.source = source
        self._profiles: dict[tuple[str, str], dict[str, Any]] = {}

    def profile_data(self, kind: str, ref: Any) -> dict[str, Any]:
        from sim.profiles.registry import load_device, load_model

        if isinstance(ref, BaseModel):  # a profile object (library use)
            return ref.model_dump(mode="json")
        if isinstance(ref, Path):
            ref = str(ref)
        if isinstance(ref, str) and ref and (("/" in ref) or ref.endswith((".yaml", ".yml"))):
            p = Path(ref)
            ref = str(p if p.is_absolute() else (self.base_dir / p))
        if not isinstance(ref, str):
            raise SimError(f"must be a profile name or a path to a YAML file, got {ref!r}", field=kind)
        key = (kind, ref)
        if key not in self._profiles:
            loaded = load_device(ref) if kind == "device" else load_model(ref)
            self._profiles[key] = loaded.model_dump(mode="json")
        return copy.deepcopy(self._profiles[key])

    def resolve_path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else self.base_dir / p


OVERRIDES_SUFFIX = " with the point's overrides"


def profile_with_overrides(kind: str, ref: Any, overrides: list[tuple[str, Any]], resolver: Resolver,
                           suffix: str = OVERRIDES_SUFFIX) -> BaseModel:
    """Profile ``kind`` (a name, a YAML path or an object) with ``overrides`` applied in order
    (:func:`sim.profiles.edits.edited_profile`): a sweep's profile axes and ``sim run --set``."""
    with _blame(kind):
        data = resolver.profile_data(kind, ref)
    return edited_profile(kind, data, overrides, suffix)





def resolve_settings(settings: dict[str, Any], resolver: Resolver | None = None) -> dict[str, Any]:
    """The complete configuration of one point (raises SettingError when it is not runnable)."""
    from sim.engine.strategies import get_strategy
    from sim.engine.strategies.base import parse_knobs

    resolver = resolver or Resolver(Path.cwd(), "spec")
    run = dict(run_defaults())
    knobs: dict[str, Any] = dict(settings.get("knobs") or {})
    overrides: dict[str, list[tuple[str, Any]]] = {"device": [], "model": []}
    calibration: Any = None
    for key, value in settings.items():
        if key == "knobs":
            continue
        with _blame(key):
            kind = classify(key)
        if kind == CALIBRATION:
            calibration = value
        elif kind == "run":
            run[key] = value
        elif kind == "knob":
            knobs[key.split(".", 1)[1]] = value
        else:
            overrides[kind].append((key, value))
    profiles = {kind: profile_with_overrides(kind, run[kind], overrides[kind], resolver).model_dump(mode="json")
                for kind in PROFILE_KINDS}
    with _blame("strategy"):
        strategy_cls = get_strategy(run["strategy"])
    try:
        knob_values = parse_knobs(strategy_cls, knobs, "knobs").model_dump(mode="json")
    except SimError as exc:
        knob = (exc.field or "").split(".")[0]
        raise SettingError(exc, f"knobs.{knob}" if knob in knobs else "strategy") from None
    trace: dict[str, Any]
    if run["trace"] is not None:
        with _blame("trace"):
            if run["preset"] is not None:
                raise SimError("give either trace or preset, not both", field="trace")
            tpath = resolver.resolve_path(str(run["trace"]))
            if not tpath.is_file():
                raise SimError("no such trace file", source=str(tpath), field="trace")
        trace = {"file": str(tpath.resolve()), "sha256": _file_hash(tpath)}
    else:
        # the base model's preset: a model renamed by an axis keeps its own activations, as in sim run
        base_model = resolver.profile_data("model", run["model"])
        trace = preset_ref(run["preset"] or base_model["name"], base_model)
    run_resolved = {k: run[k] for k in run_options() if k not in _NOT_RUN}
    with _blame("memory_budget"):
        run_resolved["memory_budget"] = _budget(run_resolved["memory_budget"])
    task = {
        "version": version(),
        "device": profiles["device"],
        "model": profiles["model"],
        "strategy": strategy_cls.name,
        "knobs": knob_values,
        "run": run_resolved,
        "trace": trace,
    }
    with _blame(CALIBRATION):
        entry = _calibration_entry(calibration, resolver, user_paths=(*knobs, *(k for k, _ in overrides["device"]),
                                                                      *(k for k, _ in overrides["model"])))
    if entry is not None:  # an uncalibrated point's task (and id) is what it was before calibrations
        task[CALIBRATION] = entry
    ident = digest(task)
    task["id"] = ident
    task["device_hash"] = digest(profiles["device"])
    task["model_hash"] = digest(profiles["model"])
    return task


def _calibration_entry(ref: Any, resolver: Resolver, *, user_paths: tuple[str, ...]) -> dict[str, Any] | None:
    """What a point's run applies of its calibration: the file's label and in-sample values, and
    the fields the point sets itself (those stay the point's); None for ``none``."""
    from sim.calibrate.calibration import load_calibration

    if ref is not None and not isinstance(ref, str | Path):
        raise SimError(f"must be a calibration file, 'none' or left out (the bundled one), got {ref!r}",
                       field=CALIBRATION)
    if isinstance(ref, str | Path) and str(ref) != "none":
        ref = resolver.resolve_path(str(ref))
    cal = load_calibration(ref)
    if cal is None:
        return None
    # only a set field a value would edit matters (the point's own value wins), so two spellings
    # of one configuration keep one id
    paths = {p for u in cal.unknowns for p in (f"{u.kind}.{u.field_path}", u.field_path)}
    return {"source": cal.source, "values": {u.name: cal.values[u.name] for u in cal.unknowns},
            "user_paths": sorted(set(user_paths) & paths)}


def config_task(config: Any, resolver: Resolver | None = None, calibration: Any = "none") -> dict[str, Any]:
    """The task of a :class:`~sim.engine.config.RunConfig` (a plan candidate, say): its options as
    a point's settings, its profile edits as ``device.``/``model.`` settings, its knobs as knobs,
    and ``calibration`` (a file, ``none``, or None: the bundled one) applied where the worker runs it."""
    settings = {name: getattr(config, name) for name in run_options()}
    settings.update(config.overrides)
    settings["knobs"] = dict(config.knobs)
    settings[CALIBRATION] = calibration
    return resolve_settings(settings, resolver)


def run_config(task: dict[str, Any], device: Any, model: Any, run: dict[str, Any] | None = None) -> Any:
    """The :class:`~sim.engine.config.RunConfig` a resolved point runs: its profiles (validated
    objects), strategy, knobs, run options (``run``: the task's own unless given) and trace."""
    from sim.engine.config import RunConfig

    trace_ref = task["trace"]
    activations = {"trace": trace_ref["file"]} if "file" in trace_ref else {"preset": trace_ref["preset"]}
    return RunConfig.of(source="sweep point", device=device, model=model, strategy=task["strategy"],
                        knobs=task["knobs"], **{**(task["run"] if run is None else run), **activations})


def preset_ref(name: str, model: Any = None) -> dict[str, Any]:
    """A synthetic-trace preset by name, with a hash of what it holds (editing it changes ids):
    a bundled preset's file, or the content of one derived for ``model`` (a model without a
    bundled preset; its hash follows the presets and profile it is derived from)."""
    from sim.profiles.registry import load_model
    from sim.traces.derived import preset_for
    from sim.traces.params import PRESET_DIR

    path = PRESET_DIR / f"{name}.yaml"
    if path.is_file():
        return {"preset": name, "sha256": _file_hash(path)}
    try:
        derived = preset_for(name, load_model(model) if model is not None else None)
    except SimError:  # an unknown preset: the point's checks name it
        return {"preset": name, "sha256": None}
    return {"preset": name, "sha256": hashlib.sha256(derived.to_yaml().encode()).hexdigest()}


def _budget(value: Any) -> Any:
    """``12GB`` and ``12000000000`` are one budget: sizes become bytes, percentages stay text."""
    if value is None:
        return None
    spec = parse_size_or_percent(value, field="memory_budget")
    return spec.bytes if spec.bytes is not None else f"{spec.fraction * 100:g}%"


def version() -> str:
    """The package version plus a digest of its code, as a point's id and rows record it.

    The version string alone never changes in a checkout, so after a ``git pull`` (an
    editable install) a resumed sweep would skip every finished point and mix rows of two
    simulators in one file. With the code's digest those points run again; the old rows stay
    (a sweep says so; ``--prune`` drops them).
    """
    import sim

    return f"{sim.__version__}+{code_digest()}"


# -- row columns ------------------------------------------------------------------------------------

def cell(value: Any) -> Any:
    """A DataFrame cell: scalars as they are, lists and mappings as compact JSON text, a profile
    object (an axis of edited phones, from Python) as its name and a digest of its fields."""
    if isinstance(value, BaseModel):
        return f"{getattr(value, 'name', type(value).__name__)}#{digest(value.model_dump(mode='json'), 8)}"
    if isinstance(value, list | dict | tuple):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return value


_NOT_RUN = ("device", "model", "strategy", "trace", "preset")  # resolved into the task's own fields


def config_columns(task: dict[str, Any]) -> dict[str, Any]:
    """The configuration of a resolved point as row columns (knobs as ``knobs.<name>``)."""
    trace = task["trace"]
    cols: dict[str, Any] = {
        "device": task["device"]["name"], "model": task["model"]["name"], "strategy": task["strategy"],
        **{k: cell(v) for k, v in task["run"].items()},
        "trace": trace.get("preset") or trace.get("file"),
        CALIBRATION: (task.get(CALIBRATION) or {}).get("source", "none"),
    }
    for name, value in task["knobs"].items():
        cols[f"knobs.{name}"] = cell(value)
    cols.update({"project_version": task["version"], "device_hash": task["device_hash"],
                 "model_hash": task["model_hash"]})
    return cols
