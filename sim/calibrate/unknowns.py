"""The registry of calibratable unknowns: what no microbenchmark gives, as data.

An unknown is a named quantity with a physical meaning, a unit, a prior range with the
evidence for it, and a scope saying which runs share its one value (a model family, a
strategy implementation, a device, an OS, or a combination). ``activation`` narrows a model
family to the models with one FFN activation function: the dReLU-sparsified Mistral-7Bs share
their activation statistics, the SiLU original does not. A scope can never name a
point, a budget or an offload: a constant per point would fit any table and predict
nothing. The bundled registry is ``validation/unknowns.yaml``.
"""

from __future__ import annotations

import fnmatch
import functools
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.bundled import bundled_dir
from sim.errors import SimError
from sim.lru import file_version, kept
from sim.profiles.schema import validate
from sim.profiles.yamlio import load_yaml_file, load_yaml_text

# What a scope may name. Anything finer (a point id, a budget, an offload) is refused.
SCOPE_KINDS = ("model", "model_family", "activation", "implementation", "device", "os")
PATH_KINDS = ("model", "device", "knobs", "preset")
REGISTRY_NAME = "unknowns.yaml"
_REGISTRY: OrderedDict[tuple, list[Unknown]] = OrderedDict()  # the bundled registry as parsed, by version


class Unknown(BaseModel):
    """One calibratable parameter (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9.-]*$")
    path: str = Field(min_length=3)
    unit: str = Field(min_length=1)
    meaning: str = Field(min_length=1)
    prior: tuple[float, float]
    evidence: str = Field(min_length=1)
    scope: dict[str, str]
    transform: Literal["linear", "log"] = "linear"
    integer: bool = False

    @field_validator("path")
    @classmethod
    def _known_kind(cls, path: str) -> str:
        kind = path.split(".", 1)[0]
        if kind not in PATH_KINDS or "." not in path:
            raise ValueError(f"must start with one of {', '.join(k + '.' for k in PATH_KINDS)}, got {path!r}")
        return path

    @field_validator("scope")
    @classmethod
    def _coarse_scope(cls, scope: dict[str, str]) -> dict[str, str]:
        if not scope:
            raise ValueError(f"must name at least one of {', '.join(SCOPE_KINDS)}")
        for key in scope:
            if key not in SCOPE_KINDS:
                raise ValueError(f"a value is shared by a {', '.join(SCOPE_KINDS)}; {key!r} would give one value "
                                 "per point, budget or offload, which fits anything and predicts nothing")
        return scope

    @model_validator(mode="after")
    def _ordered_prior(self) -> Unknown:
        lo, hi = self.prior
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"prior must be [low, high] with low < high, got {list(self.prior)}")
        if self.transform == "log" and lo <= 0:
            raise ValueError("a log-transformed prior must be positive")
        return self

    def __hash__(self) -> int:  # one unknown per name (the registry refuses duplicates)
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unknown) and other.name == self.name

    @property
    def kind(self) -> str:
        return self.path.split(".", 1)[0]

    @property
    def field_path(self) -> str:
        return self.path.split(".", 1)[1]

    @property
    def midpoint(self) -> float:
        """The prior's centre in the fit's coordinates (geometric for a log prior)."""
        return self.from_unit(0.5)

    def to_unit(self, value: float) -> float:
        """``value`` in [0, 1] across the prior range, in the fit's coordinates."""
        lo, hi = self.prior
        if self.transform == "log":
            return (math.log(value) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return (value - lo) / (hi - lo)

    def from_unit(self, u: float) -> float:
        lo, hi = self.prior
        if self.transform == "log":
            x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
        else:
            x = lo + u * (hi - lo)
        return float(round(x)) if self.integer else x

    def applies_to(self, facts: dict[str, str | None]) -> bool:
        """Whether a run with these scope facts (see :func:`sim.calibrate.apply.scope_facts`) shares the value."""
        return all(facts.get(key) == want for key, want in self.scope.items())


class _Registry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1]
    unknowns: list[Unknown]


def registry_path() -> Path:
    return bundled_dir("validation") / REGISTRY_NAME


def load_unknowns(path: str | Path | None = None) -> list[Unknown]:
    """The unknowns of the bundled registry (or of ``path``), names unique. The bundled one is
    parsed once per version of the file (unknowns are immutable; the list is a fresh copy)."""
    if path is None:
        source = registry_path()
        return list(kept(_REGISTRY, registry_version(), lambda: _parsed(source, load_yaml_text(
            source.read_text(encoding="utf-8"), str(source))), 2))
    source = Path(path)
    return _parsed(source, load_yaml_file(source))


def registry_version() -> tuple | None:
    """The bundled registry's version on disk: what a parse of it depends on."""
    return file_version(registry_path())


def _parsed(source: Path, raw: Any) -> list[Unknown]:
    reg = validate(_Registry, raw, str(source))
    seen: set[str] = set()
    for unknown in reg.unknowns:
        if unknown.name in seen:
            raise SimError(f"unknown {unknown.name!r} is declared twice", source=str(source), field="unknowns")
        seen.add(unknown.name)
    return reg.unknowns


@functools.cache  # bundled files: read once per process (a sweep validates every point)
def known_implementations(strategy: str) -> tuple[str, ...]:
    """The strategy itself and the implementations of it (``<strategy>/<whose>``) the bundled
    registry scopes values to or the published points name: what a run's ``implementation``
    may name (another name would silently run as the strategy's own)."""
    published = bundled_dir("validation") / "published.yaml"  # read here: sim.validation imports run configs
    points = load_yaml_text(published.read_text(encoding="utf-8"), str(published)).get("points") or []
    scoped = {u.scope["implementation"] for u in load_unknowns() if "implementation" in u.scope}
    scoped |= {str(p["implementation"]) for p in points if isinstance(p, dict) and p.get("implementation")}
    return (strategy, *sorted(name for name in scoped if name.startswith(f"{strategy}/")))


def select(items: list[Any], selection: str | list[str] | None, what: str, flag: str,
           key: Any = lambda item: item.name) -> list[Any]:
    """The items whose name matches any comma-separated glob of ``selection`` (None: all).

    A pattern that matches nothing is an error naming the flag, so a typo never quietly
    calibrates (or predicts) on fewer items than the user asked for; so is a pattern given
    twice (overlapping globs are fine: together they name a set).
    """
    if selection is None:
        return list(items)
    patterns = [p.strip() for p in (selection.split(",") if isinstance(selection, str) else selection)]
    if not patterns or not all(patterns):
        raise SimError(f"expected comma-separated {what} names or globs, got {selection!r}", field=flag)
    repeated = sorted({p for p in patterns if patterns.count(p) > 1})
    if repeated:  # a point (or unknown) selected twice: a fit weighs each once, so say so rather than drop it
        raise SimError(f"{', '.join(map(repr, repeated))} given twice; give each {what} once", field=flag)
    names = [key(item) for item in items]
    for pattern in patterns:
        if not fnmatch.filter(names, pattern):
            raise SimError(f"{pattern!r} matches no {what}; {what}s: {', '.join(names)}", field=flag)
    return [item for item, name in zip(items, names, strict=True)
            if any(fnmatch.fnmatchcase(name, p) for p in patterns)]
