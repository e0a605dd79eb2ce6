"""Argument checks of the library API: one-line SimErrors naming the argument and its range.

Shared by the cache policies and the trace generator (and anything else a script calls
directly). numpy scalars are taken as the Python numbers they are; booleans are not numbers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sim.errors import SimError

INT64_MAX = 2**63 - 1


def bound_text(x: float) -> str:
    """A limit as people write it: ``2**31 - 1`` rather than 2147483647."""
    for e in (15, 31, 40, 62, 63):
        if x == 2**e:
            return f"2**{e}"
        if x == 2**e - 1:
            return f"2**{e} - 1"
    return f"{x:g}" if isinstance(x, float) else str(x)


def shown(value: Any) -> str:
    """A short, one-line rendering of a rejected value (numpy scalars without their type)."""
    text = repr(value.item()) if isinstance(value, np.generic) else repr(value)
    if isinstance(value, np.ndarray):
        text = f"an array of dtype {value.dtype} and shape {value.shape}"
    return text if len(text) <= 60 else text[:57] + "..."


def range_text(lo: float, hi: float | None, lo_open: bool = False, hi_open: bool = False) -> str:
    if hi is None:
        return f"{'>' if lo_open else '>='} {bound_text(lo)}"
    return f"in {'(' if lo_open else '['}{bound_text(lo)}, {bound_text(hi)}{')' if hi_open else ']'}"


def check_int(value: Any, field: str, lo: int = 0, hi: int | None = INT64_MAX) -> int:
    """``value`` as a Python int if it is an integer (not a bool) in ``[lo, hi]`` (``hi=None``: no upper bound)."""
    if (isinstance(value, int | np.integer) and not isinstance(value, bool) and lo <= int(value)
            and (hi is None or int(value) <= hi)):
        return int(value)
    raise SimError(f"must be an integer {range_text(lo, hi)}, got {shown(value)}", field=field)


def check_real(value: Any, field: str, lo: float, hi: float | None = None, *, lo_open: bool = False,
               hi_open: bool = False) -> float:
    """``value`` as a Python float if it is a finite number (not a bool) in the given range."""
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        x = float(value)
        if (math.isfinite(x) and (x > lo if lo_open else x >= lo)
                and (hi is None or (x < hi if hi_open else x <= hi))):
            return x
    raise SimError(f"must be a finite number {range_text(lo, hi, lo_open, hi_open)}, got {shown(value)}",
                   field=field)


def check_bool(value: Any, field: str) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise SimError(f"must be True or False, got {shown(value)}", field=field)


def check_optional_bool(value: Any, field: str) -> bool | None:
    """None, or ``value`` as a Python bool (numpy bools too); anything else is an error."""
    return None if value is None else check_bool(value, field)


def int_array(value: Any, field: str, what: str) -> np.ndarray:
    """``value`` as a numpy array of an integer dtype (an empty one of any dtype), without casting."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):
        raise SimError(f"must be {what}, got {shown(value)}", field=field) from None
    if arr.dtype.kind not in "iu" and (arr.size or arr.dtype.kind not in "iuf"):
        raise SimError(f"must be {what}, got {shown(value)}", field=field)
    return arr
