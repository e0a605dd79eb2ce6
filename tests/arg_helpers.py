"""Assertions shared by the argument-check tests of several packages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sim.errors import SimError


def raises_on(field: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """``fn(*args, **kwargs)`` must raise a one-line SimError naming ``field``; returns its message."""
    with pytest.raises(SimError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert err.field == field, str(err)
    assert "\n" not in str(err) and str(err).startswith(f"{field}: ")
    return str(err)
