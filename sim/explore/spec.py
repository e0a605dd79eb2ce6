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

import copy
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from sim.checks import INT64_MAX
from sim.errors import SimError
from sim.explore.resolve import Resolver, classify, config_columns, digest, resolve_settings, version
from sim.profiles.edits import PATH_ERROR
from sim.profiles.schema import Strict, validate
from sim.units import parse_bytes

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
    seed: int = Field(0, ge=0, le=INT64_MAX)  # numpy's generators take no negative seed
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
    for knob in base.get("knobs") or {}:  # one of the two would silently win
        if f"knobs.{knob}" in base:
            raise SimError(f"sets {knob} as base.knobs does too; give each knob once", source=source,
                           field=f"base.knobs.{knob}")
    base_origins = {key: f"base.{key}" for key in base}
    resolver = Resolver(base_dir or Path.cwd(), source)
    points = []
    for axes, settings, origins in combos:
        points.append(_point(resolver, axes, {**base, **settings}, {**base_origins, **origins}))
    return points


def _point(resolver: Resolver, axes: dict[str, Any], settings: dict[str, Any],
           origins: dict[str, str] | None = None) -> Point:
    """The point of merged ``settings``, or one that records why they do not resolve."""
    origins = origins or {}
    try:
        task = resolve_settings(settings, resolver)
    except SimError as exc:
        if exc.source == PATH_ERROR:  # a misspelt field path is a spec error whatever the point
            raise SimError(exc.detail, source=resolver.source, field=origins.get(exc.field or "", exc.field)) from None
        # No configuration to hash: the settings and the error stand for it. The sweep
        # refuses to run such a point (sim.explore.point_checks names the spec field to fix).
        raw = {"version": version(), "unresolved": {k: settings[k] for k in sorted(settings)}, "error": str(exc)}
        return Point(digest(raw), axes, {}, error=str(exc), origins=origins, failure=exc)
    return Point(task["id"], axes, task, columns=config_columns(task), origins=origins)


# One combination of axis values: (axis columns, settings, where the spec sets each setting).
Combo = tuple[dict[str, Any], dict[str, Any], dict[str, str]]


def _design(spec: SweepSpec, source: str) -> list[Combo]:
    """(axis values, settings, origins) for every combination, checking keys as it goes."""
    blocks: list[list[Combo]] = []
    if spec.grid:
        axes = []
        for key, values in spec.grid.items():
            axes.append([_grid_value(key, v, i, source) for i, v in enumerate(values)])
            _unique_labels(key, values, axes[-1], source)
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


def _unique_labels(key: str, values: list[Any], combos: list[Combo], source: str) -> None:
    """A bundle axis's labels are its column: two bundles with one label would be averaged into
    one plotted point without a word, so each label (given, or the bundle's index) must differ."""
    if all(key in settings for _, settings, _ in combos):
        return  # a plain axis (each value sets the key itself): repeated values are the user's replicates
    seen: dict[Any, int] = {}
    for index, (axes, _, _) in enumerate(combos):
        label = axes[key]
        marker = (type(label).__name__, label) if isinstance(label, bool) else label
        if marker in seen:
            raise SimError(f"label {label!r} is used by bundles {seen[marker]} and {index}; each bundle of an axis "
                           "needs its own label", source=source, field=f"grid.{key}.{index}.label")
        seen[marker] = index


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
