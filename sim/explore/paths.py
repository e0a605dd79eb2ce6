"""Dotted paths into profile data: how a sweep axis names and edits a profile field.

``storage.seq_read.*.gbps`` walks mappings by key and lists by index, by ``*`` (every
entry) or by an entry's ``name`` (``cpu.clusters.big.cores``); the field(s) reached are set
or, with ``scale``, multiplied. Errors name the place the path went wrong.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.checks import shown
from sim.errors import SimError

# The source of a SimError for a path that names no field: a spec error, not a failed point.
PATH_ERROR = "<unknown field path>"


def apply_path(data: dict[str, Any], path: str, value: Any, *, scale: bool = False, where: str = "") -> None:
    """Set (or multiply, with ``scale``) the field(s) at ``path`` in a profile's dumped data."""
    steps = path.split(".")
    targets: list[tuple[Any, Any]] = []
    _walk(data, steps, [], targets, where)
    for parent, key in targets:
        if scale:
            current = parent[key]
            if isinstance(current, bool) or not isinstance(current, int | float):
                raise SimError(f"cannot scale a non-numeric field (value {shown(current)})", field=where)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SimError(f"a :scale value must be a number, got {shown(value)}", field=where)
            parent[key] = int(round(current * value)) if isinstance(current, int) else float(current * value)
        else:
            parent[key] = copy.deepcopy(value)


def _walk(node: Any, steps: list[str], done: list[str], out: list[tuple[Any, Any]], where: str) -> None:
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
            out.append((node, key))
