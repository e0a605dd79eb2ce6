"""Option checks shared by several commands."""

from __future__ import annotations

from typing import get_args

from sim.errors import SimError
from sim.profiles.formats import WeightsDtype


def check_dtype(value: str | None) -> str | None:
    allowed = get_args(WeightsDtype)
    if value is not None and value not in allowed:
        raise SimError(f"must be one of {', '.join(allowed)}; got {value!r}", field="--weights-dtype")
    return value
