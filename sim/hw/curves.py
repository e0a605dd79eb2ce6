"""Interpolation of measured hardware curves, with a record of extrapolation.

Storage throughput grows roughly linearly in log(request size) between measured points
[PI2 §2.3: 450 MB/s at 4 KB to 4 GB/s at 512 KB], so curves interpolate in log-log
space. Outside the measured range the nearest point is used and the caller is told, so
the simulator can warn that it is predicting outside its profile's data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def loglog_interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> tuple[float, bool]:
    """Interpolate y(x) in log-log space; return (value, extrapolated?). Clamps at the ends."""
    if x <= xs[0]:
        return float(ys[0]), x < xs[0]
    if x >= xs[-1]:
        return float(ys[-1]), x > xs[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return float(math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))), False
    return float(ys[-1]), False


def linlog_interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> tuple[float, bool]:
    """Interpolate y linearly against log(x) (for efficiency and range factors)."""
    if x <= xs[0]:
        return float(ys[0]), x < xs[0]
    if x >= xs[-1]:
        return float(ys[-1]), x > xs[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            f = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
            return float(ys[i - 1] + f * (ys[i] - ys[i - 1])), False
    return float(ys[-1]), False
