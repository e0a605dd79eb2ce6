"""Shared helpers for the profile tests: bundled files, schema lookup, comment checks."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from sim.profiles.device import BUNDLED_DIR as DEVICE_DIR
from sim.profiles.device import DeviceProfile
from sim.profiles.model import BUNDLED_DIR as MODEL_DIR
from sim.profiles.model import ModelProfile

SCHEMAS: dict[str, type[BaseModel]] = {"device": DeviceProfile, "model": ModelProfile}
DIRS = {"device": DEVICE_DIR, "model": MODEL_DIR}


def bundled_files() -> list[tuple[str, Path]]:
    """Every bundled profile as (kind, path)."""
    return [(kind, path) for kind, folder in DIRS.items() for path in sorted(folder.glob("*.yaml"))]


_SIZE = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*[KMGT]i?B\s*$", re.IGNORECASE)
_NUMERIC_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


def _value_scalars(node: yaml.Node):
    """Scalar nodes that are values (mapping values or sequence items), never keys."""
    if isinstance(node, yaml.MappingNode):
        for _, value in node.value:
            yield from _value_scalars(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _value_scalars(item)
    elif isinstance(node, yaml.ScalarNode):
        yield node


def uncommented_numeric_lines(text: str) -> list[int]:
    """1-based lines holding a number or a size (``24GB``) with no ``#`` comment after it.

    Quoted strings are text, not figures, so only plain scalars count; YAML's own resolver
    decides what is a number, so ``1e3`` and ``0x10`` count and ``Gen 3`` does not.
    """
    lines = text.splitlines()
    missing = set()
    for node in _value_scalars(yaml.compose(text, Loader=yaml.SafeLoader)):
        if node.style is not None:
            continue
        if node.tag in _NUMERIC_TAGS or _SIZE.match(node.value):
            line = node.end_mark.line
            if "#" not in lines[line][node.end_mark.column:]:
                missing.add(line + 1)
    return sorted(missing)


def _unwrap(annotation: Any) -> Any:
    """list[X] -> X, X | None -> X, Annotated[X, ...] -> X (repeatedly)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0]
        elif origin is list:
            annotation = typing.get_args(annotation)[0]
        else:
            return annotation


def field_is_required(schema: type[BaseModel], path: tuple[Any, ...]) -> bool:
    """Whether the field at ``path`` (dict keys and list indices) is required by the schema."""
    model: Any = schema
    for step in path[:-1]:
        if isinstance(step, int):
            continue  # list index: the element type was unwrapped with the list itself
        model = _unwrap(model.model_fields[step].annotation)
    return model.model_fields[path[-1]].is_required()
