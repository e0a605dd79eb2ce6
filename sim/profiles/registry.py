"""Resolve profile names to bundled YAML files, or load a user's file by path.

A name (``oneplus-12``) resolves to a bundled profile; anything with a path separator or
a ``.yaml``/``.yml`` suffix is a user's file.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from sim.errors import SimError
from sim.profiles.device import BUNDLED_DIR as DEVICE_DIR
from sim.profiles.device import DeviceProfile
from sim.profiles.model import BUNDLED_DIR as MODEL_DIR
from sim.profiles.model import ModelProfile
from sim.profiles.schema import validate
from sim.profiles.yamlio import load_yaml_file

P = TypeVar("P", bound=BaseModel)
KINDS: dict[str, tuple[type[BaseModel], Path]] = {
    "device": (DeviceProfile, DEVICE_DIR),
    "model": (ModelProfile, MODEL_DIR),
}


def bundled_names(kind: str) -> list[str]:
    _, folder = KINDS[kind]
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _is_path(ref: str) -> bool:
    return "/" in ref or "\\" in ref or ref.endswith((".yaml", ".yml"))


def resolve_path(kind: str, ref: str | Path) -> Path:
    """The file a name or path refers to; unknown names list what exists."""
    ref_text = str(ref)
    if isinstance(ref, Path) or _is_path(ref_text):
        return Path(ref_text)
    _, folder = KINDS[kind]
    path = folder / f"{ref_text}.yaml"
    if not path.is_file():
        raise SimError(f"unknown {kind} {ref_text!r}; bundled {kind}s: {', '.join(bundled_names(kind))} "
                       "(or give a path to a YAML file)", field=f"--{kind}")
    return path


def load_profile_file(kind: str, path: Path) -> BaseModel:
    """Load and validate one YAML profile of the given kind."""
    model_cls, _ = KINDS[kind]
    data = load_yaml_file(path)
    try:
        return validate(model_cls, data, str(path))
    except SimError:
        other = _looks_like(data)
        if other is not None and other != kind:  # a whole file of "unknown field" errors says less
            raise SimError(f"is a {other} profile, not a {kind} profile; pass it as --{other}", source=str(path),
                           field=f"--{kind}") from None
        raise


def _looks_like(data: object) -> str | None:
    """The kind a profile's top-level keys show, if they show one (see :func:`detect_kind`)."""
    if not isinstance(data, dict):
        return None
    if "cpu" in data or "storage" in data or "dram" in data:
        return "device"
    if "n_layers" in data or "ffn_dim" in data or "hidden" in data:
        return "model"
    return None


@functools.lru_cache(maxsize=64)
def _cached(kind: str, path: str, mtime: float) -> BaseModel:
    return load_profile_file(kind, Path(path))


def load_device(ref: str | Path | DeviceProfile) -> DeviceProfile:
    if isinstance(ref, BaseModel | dict):
        return _checked_object("device", ref)  # type: ignore[return-value]
    path = resolve_path("device", _reference("device", ref))
    return _load(path, "device")  # type: ignore[return-value]


def load_model(ref: str | Path | ModelProfile) -> ModelProfile:
    if isinstance(ref, BaseModel | dict):
        return _checked_object("model", ref)  # type: ignore[return-value]
    path = resolve_path("model", _reference("model", ref))
    return _load(path, "model")  # type: ignore[return-value]


def _reference(kind: str, ref: object) -> str | Path:
    if not isinstance(ref, str | Path):
        raise SimError(f"expected a {kind} name, a path to a YAML file or a profile object, got "
                       f"{type(ref).__name__}", field=f"--{kind}")
    return ref


def _checked_object(kind: str, obj: BaseModel | dict) -> BaseModel:
    """A profile given as an object (or a mapping), validated as a file would be.

    ``model_copy(update=...)`` and attribute assignment skip pydantic's checks, and a NaN
    bandwidth or a zero page size would otherwise hang or crash the engine far from the
    edit that caused it.
    """
    model_cls, _ = KINDS[kind]
    if isinstance(obj, BaseModel) and not isinstance(obj, model_cls):
        raise SimError(f"expected a {model_cls.__name__} (a {kind} profile), got {type(obj).__name__}",
                       field=f"--{kind}")
    data = obj.model_dump() if isinstance(obj, BaseModel) else obj
    return validate(model_cls, data, f"{kind} {data.get('name', '?')!s} (given as an object)")


def _load(path: Path, kind: str) -> BaseModel:
    if path.is_dir():
        raise SimError("is a folder; expected a YAML file", source=str(path))
    if not path.is_file():
        raise SimError("is not a regular file; expected a YAML file" if path.exists() else "no such file",
                       source=str(path))
    return _cached(kind, str(path.resolve()), path.stat().st_mtime)


def detect_kind(path: Path) -> str:
    """Guess a file's kind from its top-level keys (for `sim profiles validate`)."""
    kind = _looks_like(load_yaml_file(path))
    if kind is not None:
        return kind
    raise SimError("cannot tell whether this is a device or a model profile (a device has "
                   "cpu/dram/storage sections, a model has n_layers/hidden/ffn_dim)", source=str(path))
