"""Dotted paths into profile data: how a sweep axis names and edits a profile field.

``storage.seq_read.*.gbps`` walks mappings by key and lists by index, by ``*`` (every
entry) or by an entry's ``name`` (``cpu.clusters.big.cores``); the field(s) reached are set
or, with ``scale``, multiplied. Errors name the place the path went wrong.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from sim.checks import shown
from sim.errors import SimError

# The source of a SimError for a path that names no field: a spec error, not a failed point.
PATH_ERROR = "<unknown field path>"


def apply_path(data: dict[str, Any], path: str, value: Any, *, scale: bool = False, where: str = "") -> list[str]:
    """Set (or multiply, with ``scale``) the field(s) at ``path`` in a profile's dumped data.

    Returns the concrete paths it changed (``cpu.clusters.0.cores`` for ``cpu.clusters.big.cores``),
    so an error found later by validation can be traced to the edit that made it.
    """
    steps = path.split(".")
    targets: list[tuple[Any, Any, str]] = []
    _walk(data, steps, [], targets, where)
    for parent, key, _ in targets:
        if scale:
            parent[key] = _scaled(parent[key], value, where)
        else:
            parent[key] = copy.deepcopy(value)
    return [concrete for _, _, concrete in targets]


def _scaled(current: Any, factor: Any, where: str) -> int | float:
    """``current * factor``. A whole product of an integer stays an integer; any other stays a
    float, so an integer field (cores, layers) refuses 2.5 instead of rounding it silently,
    while a byte count (which may be fractional before rounding) and a float field keep it."""
    if isinstance(current, bool) or not isinstance(current, int | float):
        raise SimError(f"cannot scale a non-numeric field (value {shown(current)})", field=where)
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        raise SimError(f"a :scale value must be a number, got {shown(factor)}", field=where)
    product = float(current) * float(factor)
    if not math.isfinite(product):
        raise SimError(f"scaling {shown(current)} by {shown(factor)} gives {product}; the result must be a "
                       "finite number", field=where)
    if isinstance(current, int) and abs(product - round(product)) <= 1e-9 * max(1.0, abs(product)):
        return int(round(product))
    return product


def _walk(node: Any, steps: list[str], done: list[str], out: list[tuple[Any, Any, str]], where: str) -> None:
    step, rest = steps[0], steps[1:]
    here = ".".join(done) or "(top level)"
    if isinstance(node, dict):
        if step not in node:
            raise SimError(f"no field {step!r} at {here}; fields there: {', '.join(sorted(node))}",
                           source=PATH_ERROR, field=where)
        keys: list[Any] = [step]
    elif isinstance(node, list):
        if step == "*":
            keys = list(range(len(node)))
            if not keys:
                raise SimError(f"* matches no entry: {here} is an empty list", field=where)
        elif step.lstrip("-").isdigit():
            i = int(step)
            if not -len(node) <= i < len(node):
                raise SimError(f"index {i} is out of range at {here} ({len(node)} entries)", field=where)
            keys = [i]
        else:
            keys = [i for i, item in enumerate(node) if isinstance(item, dict) and item.get("name") == step]
            if not keys:
                names = [str(item.get("name")) for item in node if isinstance(item, dict) and "name" in item]
                raise SimError(f"no entry named {step!r} at {here}; use an index, * or one of: "
                               f"{', '.join(names) or '(no named entries)'}", field=where)
    else:
        raise SimError(f"{here} is {node!r}, not a section; cannot go into {step!r}", field=where)
    for key in keys:
        if rest:
            _walk(node[key], rest, [*done, str(key)], out, where)
        else:
            out.append((node, key, ".".join([*done, str(key)])))
