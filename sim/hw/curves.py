"""Interpolation of measured hardware curves, with a record of extrapolation.

Storage throughput grows roughly linearly in log(request size) between measured points
[PI2 §2.3: 450 MB/s at 4 KB to 4 GB/s at 512 KB], so curves interpolate in log-log
space. Outside the measured range the nearest point is used and the caller is told, so
the simulator can warn that it is predicting outside its profile's data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _locate(x: float, xs: Sequence[float]) -> tuple[int, float] | None:
    """Segment i (xs[i-1] <= x <= xs[i]) and x's position in it on a log axis; None outside."""
    if x <= xs[0] or x >= xs[-1]:
        return None
    for i in range(1, len(xs)):
        if x <= xs[i]:
            return i, (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return None


def _clamped(x: float, xs: Sequence[float], ys: Sequence[float]) -> tuple[float, bool]:
    """The nearest end point, and whether x lies strictly outside the measured range."""
    if x <= xs[0]:
        return float(ys[0]), x < xs[0]
    return float(ys[-1]), x > xs[-1]


def loglog_interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> tuple[float, bool]:
    """Interpolate y(x) in log-log space; return (value, extrapolated?). Clamps at the ends."""
    where = _locate(x, xs)
    if where is None:
        return _clamped(x, xs, ys)
    i, f = where
    return float(math.exp(math.log(ys[i - 1]) + f * (math.log(ys[i]) - math.log(ys[i - 1])))), False


def linlog_interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> tuple[float, bool]:
    """Interpolate y linearly against log(x) (for efficiency and range factors)."""
    where = _locate(x, xs)
    if where is None:
        return _clamped(x, xs, ys)
    i, f = where
    return float(ys[i - 1] + f * (ys[i] - ys[i - 1])), False
