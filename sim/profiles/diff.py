"""Two profiles side by side, field by field, with the ratio of each number.

Comparing a measured profile with a datasheet one (or two phones) is a question about the
same field in both, so each profile is flattened to field paths: list entries are keyed
by what identifies them (a cluster's ``name``, a curve point's ``block``, a span, a batch)
rather than by position, so ``storage.rand_read[4KiB].gbps`` lines up even when the two
curves were measured at different sizes.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel

KEYS = ("name", "block", "span", "batch")  # what names a list entry, in order of preference
KIB = 1024


def _key(item: dict[str, Any], index: int) -> tuple[str, str | None]:
    for key in KEYS:
        if key in item:
            value = item[key]
            if key in ("block", "span") and isinstance(value, int):
                return _size(value), key
            return str(value), key
    return str(index), None


def _size(n: int) -> str:
    for unit, scale in (("GiB", KIB ** 3), ("MiB", KIB ** 2), ("KiB", KIB)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"cpu.clusters[big].cores": 1, ...}``: every leaf of a dumped profile by its path."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        for i, item in enumerate(data):
            label, used = _key(item, i)
            rest = {k: v for k, v in item.items() if k != used}
            out.update(flatten(rest, f"{prefix}[{label}]"))
    else:
        out[prefix] = data
    return out


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def diff_rows(a: BaseModel, b: BaseModel, *, all_fields: bool = True) -> list[dict[str, Any]]:
    """One row per field of either profile: ``field``, ``a``, ``b`` (None where absent) and
    ``ratio`` (b / a where both are numbers and a is not zero). Without ``all_fields`` only
    the fields that differ."""
    fa = flatten(a.model_dump(mode="json"))
    fb = flatten(b.model_dump(mode="json"))
    order = list(fa) + [k for k in fb if k not in fa]
    rows = []
    for field in order:
        va, vb = fa.get(field), fb.get(field)
        if not all_fields and va == vb:
            continue
        na, nb = _number(va), _number(vb)
        ratio = nb / na if na is not None and nb is not None and na != 0 and math.isfinite(nb / na) else None
        rows.append({"field": field, "a": va, "b": vb, "ratio": ratio})
    return rows
