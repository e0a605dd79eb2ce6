"""Sweep specifications: a base run plus axes, expanded into fully resolved points.

A spec is a YAML mapping, validated like the profiles (one-line errors naming the field)::

    name: mixtral-dram-vs-ufs
    base:                       # run options, knobs and profile fields shared by every point
      device: oneplus-12
      model: turbosparse-mixtral-47b
      decode_tokens: 32
    grid:                       # the cartesian product of these axes ...
      memory_budget: [8GB, 12GB, 16GB]
      strategy: [powerinfer2, llm-in-flash]
      device.storage.rand_read.*.gbps:scale: [0.5, 1, 2]
    points:                     # ... times this list of explicit points ...
      - {knobs.cluster_neurons: 256}
      - {knobs.cluster_neurons: 1024, policy: s3fifo}
    sample:                     # ... times N random or Latin-hypercube samples ...
      method: lhs
      n: 16
      seed: 1
      ranges:
        device.dram.usable_bytes: {low: 8GB, high: 19GB}
        knobs.hot_share: {low: 0.1, high: 0.9}
        policy: {choices: [lru, s3fifo]}
    seeds: [0, 1, 2]            # ... times these seeds.

A *setting* key is one of

- a run option of :func:`sim.engine.simulation.simulate` (``memory_budget``, ``strategy``,
  ``policy``, ``seed``, ``decode_tokens`` ...: whatever its signature offers);
- ``knobs.<name>``: one strategy knob (``base`` may also hold a ``knobs`` mapping);
- ``device.<path>`` / ``model.<path>``: a profile field by dotted path. A path step into a
  list is an index (``device.cpu.clusters.0.cores``), an element's ``name``
  (``device.cpu.clusters.big.cores``) or ``*`` for every element. A ``:scale`` suffix
  multiplies the field(s) instead of replacing them
  (``device.storage.seq_read.*.gbps:scale: [0.5, 2]`` halves or doubles a whole curve).

A grid axis may also bundle several settings that change together: any other name whose
values are mappings of settings; the axis column then holds each mapping's ``label``::

    grid:
      storage:
        - {label: ufs3.1, device.storage.rand_read.*.gbps:scale: 0.6}
        - {label: ufs4.0}

Each point resolves to a complete configuration (profiles after overrides, every run
option and knob with its default filled in, the trace preset's file hash, the project
version) whose hash is the point's stable id: re-running a spec finds finished points by
id, and two spellings of one configuration (``knobs: {}`` vs the default's value) share it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import inspect
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from sim.errors import SimError
from sim.explore.paths import PATH_ERROR, apply_path
from sim.profiles.validation import Strict, validate
from sim.units import parse_bytes, parse_size_or_percent

NOT_SETTINGS = ("knobs", "timeline")  # knobs have their own keys; a timeline is not a result
PROFILE_KINDS = ("device", "model")
SCALE_SUFFIX = ":scale"
MAX_POINTS = 1_000_000


# -- the YAML schema ----------------------------------------------------------------------------

class RangeAxis(Strict):
    """A sampled axis: a numeric range (sizes such as ``8GB`` allowed) or a list of choices."""

    low: float | int | str | None = None
    high: float | int | str | None = None
    log: bool = False  # sample uniformly in log space (for sizes and rates spanning decades)
    integer: bool = False  # round to whole numbers (core counts, cluster sizes)
    choices: list[Any] | None = Field(default=None, min_length=1)


class SampleSpec(Strict):
    method: Literal["lhs", "random"] = "lhs"
    n: int = Field(ge=1, le=MAX_POINTS)
    seed: int = 0
    ranges: dict[str, RangeAxis] = Field(min_length=1)


class SweepSpec(Strict):
    name: str | None = None
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(default_factory=dict)
    points: list[dict[str, Any]] = Field(default_factory=list)
    sample: SampleSpec | None = None
    seeds: list[int] | None = Field(default=None, min_length=1)


# -- points -----------------------------------------------------------------------------------

@dataclass
class Point:
    """One configuration of a sweep: its axis values and everything a worker needs to run it."""

    id: str
    axes: dict[str, Any]  # axis column -> value, as written in the spec
    task: dict[str, Any]  # resolved configuration (see resolve_settings); empty when it failed
    error: str | None = None  # why the settings do not resolve (a spec error: the sweep will not run)
    columns: dict[str, Any] = field(default_factory=dict)  # config + metadata columns of its row
    origins: dict[str, str] = field(default_factory=dict)  # setting key -> where the spec sets it
    failure: SimError | None = field(default=None, repr=False)  # the exception behind ``error``

    @property
    def trace_key(self) -> tuple:
        t = self.task
        if not t:
            return ()
        return (t["model_hash"], json.dumps(t["trace"], sort_keys=True), t["run"]["seed"],
                t["run"]["warmup_tokens"] + t["run"]["decode_tokens"])


def load_spec(path: str | Path) -> tuple[SweepSpec, Path]:
    """Read and validate a spec file; returns it with the folder relative paths start from."""
    from sim.profiles.yamlio import load_yaml_file

    p = Path(path)
    spec = validate(SweepSpec, load_yaml_file(p), str(p))
    if spec.name is None:
        spec = spec.model_copy(update={"name": p.stem})
    return spec, p.resolve().parent


def spec_from_mapping(data: dict[str, Any], source: str = "<spec>") -> SweepSpec:
    return validate(SweepSpec, data, source)


def expand(spec: SweepSpec, base_dir: Path | None = None, source: str = "spec") -> list[Point]:
    """All points of a spec, in order: grid x points x samples x seeds."""
    combos = _design(spec, source)
    base = dict(spec.base)
    for key in base:
        if key != "knobs":
            classify(key, source, "base")
    if "knobs" in base and not isinstance(base["knobs"], dict):
        raise SimError("must be a mapping of knob names to values", source=source, field="base.knobs")
    base_origins = {key: f"base.{key}" for key in base}
    resolver = _Resolver(base_dir or Path.cwd(), source)
    points = []
    for axes, settings, origins in combos:
        points.append(resolver.point(axes, {**base, **settings}, {**base_origins, **origins}))
    return points


# One combination of axis values: (axis columns, settings, where the spec sets each setting).
Combo = tuple[dict[str, Any], dict[str, Any], dict[str, str]]


def _design(spec: SweepSpec, source: str) -> list[Combo]:
    """(axis values, settings, origins) for every combination, checking keys as it goes."""
    blocks: list[list[Combo]] = []
    if spec.grid:
        axes = []
        for key, values in spec.grid.items():
            axes.append([_grid_value(key, v, i, source) for i, v in enumerate(values)])
        blocks.append([_merge(combo) for combo in itertools.product(*axes)])
    if spec.points:
        block = []
        for i, pt in enumerate(spec.points):
            for key in pt:
                classify(key, source, f"points.{i}")
            block.append((dict(pt), dict(pt), {k: f"points.{i}.{k}" for k in pt}))
        blocks.append(block)
    if spec.sample is not None:
        blocks.append([(s, dict(s), {k: f"sample.ranges.{k}" for k in s})
                       for s in sample_points(spec.sample, source)])
    if spec.seeds is not None:
        blocks.append([({"seed": s}, {"seed": s}, {"seed": "seeds"}) for s in spec.seeds])
    _one_block_per_setting(blocks, source)
    total = math.prod(len(b) for b in blocks) if blocks else 1
    if total > MAX_POINTS:
        raise SimError(f"the spec expands to {total:,} points; at most {MAX_POINTS:,} are allowed", source=source)
    if not blocks:
        return [({}, {}, {})]
    return [_merge(combo) for combo in itertools.product(*blocks)]


def _one_block_per_setting(blocks: list[list[Combo]], source: str) -> None:
    """A setting varied by two blocks (``grid.seed`` and ``seeds``, say) would have one block's
    values silently overwrite the other's in every combination: refuse it, naming both."""
    seen: dict[str, str] = {}
    for block in blocks:
        where: dict[str, str] = {}
        for _axes, _settings, origins in block:
            for key, origin in origins.items():
                where.setdefault(key, origin)
        for key, origin in where.items():
            if key in seen:
                raise SimError(f"{key!r} is varied both here and by {seen[key]}; vary each setting in one place",
                               source=source, field=origin)
            seen[key] = origin


def _merge(parts: tuple[Combo, ...]) -> Combo:
    axes: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for a, s, o in parts:
        axes.update(a)
        settings.update(s)
        origins.update(o)
    return axes, settings, origins


def _grid_value(key: str, value: Any, index: int, source: str) -> Combo:
    """One value of a grid axis: a plain setting, or a bundle of settings with a label."""
    where = f"grid.{key}.{index}"
    try:
        classify(key, source, f"grid.{key}")
    except SimError:
        if not isinstance(value, dict):
            raise
        settings = {k: v for k, v in value.items() if k != "label"}
        for k in settings:
            classify(k, source, f"{where}.{k}")
        label = value.get("label", index)
        if isinstance(label, dict | list):
            raise SimError("a label must be a plain value", source=source, field=f"{where}.label") from None
        return {key: label}, settings, {k: f"{where}.{k}" for k in settings}
    return {key: value}, {key: value}, {key: f"grid.{key}"}


def classify(key: str, source: str = "spec", where: str | None = None) -> str:
    """What a setting key addresses: ``run``, ``knob``, ``device`` or ``model``."""
    if not isinstance(key, str):
        raise SimError(f"setting names must be text, got {key!r}", source=source, field=where)
    if key in run_options():
        return "run"
    head, _, rest = key.partition(".")
    if head == "knobs" and rest and "." not in rest:
        return "knob"
    if head in PROFILE_KINDS and rest:
        return head
    raise SimError(f"unknown setting {key!r}; use a run option ({', '.join(run_options())}), knobs.<name>, "
                   "device.<field path> or model.<field path> (a grid axis may also map a name to mappings "
                   "of settings)", source=source, field=where or key)


# -- sampling -------------------------------------------------------------------------------------

def sample_points(sample: SampleSpec, source: str = "spec") -> list[dict[str, Any]]:
    """``n`` points over the ranges: Latin hypercube (one sample per stratum per axis) or iid."""
    rng = np.random.default_rng(sample.seed)
    n = sample.n
    columns: dict[str, list[Any]] = {}
    for key, rng_axis in sample.ranges.items():
        classify(key, source, f"sample.ranges.{key}")
        u = (rng.permutation(n) + rng.random(n)) / n if sample.method == "lhs" else rng.random(n)
        columns[key] = _map_unit(u, rng_axis, source, f"sample.ranges.{key}")
    return [{k: v[i] for k, v in columns.items()} for i in range(n)]


def _map_unit(u: np.ndarray, axis: RangeAxis, source: str, where: str) -> list[Any]:
    if axis.choices is not None:
        if axis.low is not None or axis.high is not None:
            raise SimError("give either choices or low/high, not both", source=source, field=where)
        idx = np.minimum((u * len(axis.choices)).astype(int), len(axis.choices) - 1)
        return [copy.deepcopy(axis.choices[i]) for i in idx]
    if axis.low is None or axis.high is None:
        raise SimError("a range needs low and high (or choices)", source=source, field=where)
    sizes = isinstance(axis.low, str) or isinstance(axis.high, str)
    lo = float(parse_bytes(axis.low, source=source, field=f"{where}.low")) if sizes else float(axis.low)
    hi = float(parse_bytes(axis.high, source=source, field=f"{where}.high")) if sizes else float(axis.high)
    if not lo < hi:
        raise SimError(f"low must be below high, got {axis.low!r} and {axis.high!r}", source=source, field=where)
    if axis.log:
        if lo <= 0:
            raise SimError("a log range needs low > 0", source=source, field=where)
        values = np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo)))
    else:
        values = lo + u * (hi - lo)
    if sizes or axis.integer:
        return [int(round(v)) for v in values]
    return [float(v) for v in values]


# -- resolution -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def run_defaults() -> dict[str, Any]:
    """:func:`simulate`'s run options and their defaults, read from its signature (never
    copied), so an option the engine gains is a setting (and part of every id) at once."""
    from sim.engine.simulation import simulate

    params = inspect.signature(simulate).parameters
    return {name: p.default for name, p in params.items() if name not in NOT_SETTINGS}


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


class _Resolver:
    """Turns merged settings into a task; caches loaded profiles."""

    def __init__(self, base_dir: Path, source: str):
        self.base_dir = base_dir
        self.source = source
        self._profiles: dict[tuple[str, str], dict[str, Any]] = {}

    def point(self, axes: dict[str, Any], settings: dict[str, Any], origins: dict[str, str] | None = None) -> Point:
        origins = origins or {}
        try:
            task = resolve_settings(settings, self)
        except SimError as exc:
            if exc.source == PATH_ERROR:  # a misspelt field path is a spec error whatever the point
                raise SimError(exc.detail, source=self.source, field=origins.get(exc.field or "", exc.field)) from None
            # No configuration to hash: the settings and the error stand for it. The sweep
            # refuses to run such a point (sim.explore.checks names the spec field to fix).
            raw = {"version": _version(), "unresolved": {k: settings[k] for k in sorted(settings)},
                   "error": str(exc)}
            return Point(digest(raw), axes, {}, error=str(exc), origins=origins, failure=exc)
        return Point(task["id"], axes, task, columns=config_columns(task), origins=origins)

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




class SettingError(SimError):
    """A point's settings do not resolve, and ``key`` is the setting to blame.

    The key (``memory_budget``, ``knobs.hot_share``, ``device.storage.rand_read.*.gbps:scale``
    ...) lets the sweep name the spec field to fix (``grid.memory_budget``) instead of an
    engine option the user never typed.
    """

    def __init__(self, exc: SimError, key: str):
        super().__init__(exc.detail, source=exc.source, field=exc.field)
        self.key = key


@contextlib.contextmanager
def _blame(key: str) -> Iterator[None]:
    """Tag a SimError raised inside the block with the setting that caused it."""
    try:
        yield
    except SettingError:
        raise
    except SimError as exc:
        raise SettingError(exc, key) from None


def overrides_source(kind: str, name: str) -> str:
    """The ``source`` of an error in a profile after a point's overrides (not a file of its own)."""
    return f"{kind} {name}{OVERRIDES_SUFFIX}"


OVERRIDES_SUFFIX = " with the point's overrides"


def resolve_settings(settings: dict[str, Any], resolver: _Resolver | None = None) -> dict[str, Any]:
    """The complete configuration of one point (raises SettingError when it is not runnable)."""
    import sim
    from sim.engine.strategies.base import get_strategy, parse_knobs
    from sim.profiles.device import DeviceProfile
    from sim.profiles.model import ModelProfile

    resolver = resolver or _Resolver(Path.cwd(), "spec")
    run = dict(run_defaults())
    knobs: dict[str, Any] = dict(settings.get("knobs") or {})
    overrides: dict[str, list[tuple[str, Any]]] = {"device": [], "model": []}
    for key, value in settings.items():
        if key == "knobs":
            continue
        with _blame(key):
            kind = classify(key)
        if kind == "run":
            run[key] = value
        elif kind == "knob":
            knobs[key.split(".", 1)[1]] = value
        else:
            overrides[kind].append((key, value))
    profiles: dict[str, Any] = {}
    for kind, cls in (("device", DeviceProfile), ("model", ModelProfile)):
        with _blame(kind):
            data = resolver.profile_data(kind, run[kind])
        for key, value in overrides[kind]:
            path = key.split(".", 1)[1]
            scale = path.endswith(SCALE_SUFFIX)
            if scale:
                path = path[: -len(SCALE_SUFFIX)]
            with _blame(key):
                apply_path(data, path, value, scale=scale, where=key)
        name = data.get("name", run[kind])
        try:
            profiles[kind] = validate(cls, data, overrides_source(kind, name)).model_dump(mode="json")
        except SimError as exc:
            raise SettingError(exc, _override_for(kind, exc.field, overrides[kind])) from None
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
        trace = preset_ref(run["preset"] or profiles["model"]["name"])
    run_resolved = {k: run[k] for k in run_options() if k not in _NOT_RUN}
    with _blame("memory_budget"):
        run_resolved["memory_budget"] = _budget(run_resolved["memory_budget"])
    task = {
        "version": sim.__version__,
        "device": profiles["device"],
        "model": profiles["model"],
        "strategy": strategy_cls.name,
        "knobs": knob_values,
        "run": run_resolved,
        "trace": trace,
    }
    ident = digest(task)
    task["id"] = ident
    task["device_hash"] = digest(profiles["device"])
    task["model_hash"] = digest(profiles["model"])
    return task


def _override_for(kind: str, error_path: str | None, overrides: list[tuple[str, Any]]) -> str:
    """The override of a profile most likely behind a validation error at ``error_path``.

    Paths match step by step, ``*`` and entry names matching any index; one path may be
    a prefix of the other (an override of a whole section, or an error on the section
    holding the field, such as usable_bytes above total_bytes). The last match wins (it
    was applied last); with none, the profile itself is to blame.
    """
    got = [s for s in (error_path or "").split(".") if s]
    for key, _value in reversed(overrides):
        steps = key.split(".", 1)[1].removesuffix(SCALE_SUFFIX).split(".")
        if all(_same_step(a, b) for a, b in zip(steps, got, strict=False)):
            return key
    return kind


def _same_step(written: str, reached: str) -> bool:
    """Whether an override's path step can address the step an error reports."""
    return written in (reached, "*") or (reached.isdigit() and not written.lstrip("-").isdigit())


def preset_ref(name: str) -> dict[str, Any]:
    """A synthetic-trace preset by name, with its file's hash (editing a preset changes ids)."""
    from sim.traces.params import PRESET_DIR

    path = PRESET_DIR / f"{name}.yaml"
    return {"preset": name, "sha256": _file_hash(path) if path.is_file() else None}


def _budget(value: Any) -> Any:
    """``12GB`` and ``12000000000`` are one budget: sizes become bytes, percentages stay text."""
    if value is None:
        return None
    spec = parse_size_or_percent(value, field="memory_budget")
    return spec.bytes if spec.bytes is not None else f"{spec.fraction * 100:g}%"


def _version() -> str:
    import sim

    return sim.__version__


# -- row columns ------------------------------------------------------------------------------------

def cell(value: Any) -> Any:
    """A DataFrame cell: scalars as they are, lists and mappings as compact JSON text."""
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
    }
    for name, value in task["knobs"].items():
        cols[f"knobs.{name}"] = cell(value)
    cols.update({"project_version": task["version"], "device_hash": task["device_hash"],
                 "model_hash": task["model_hash"]})
    return cols
