"""Bounded in-process memos: the value made once per key, the least recently used dropped.

Several parts keep costly results for the runs that follow in the same process (generated
traces, edited presets, run summaries); each keeps only its last few, which is this.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

V = TypeVar("V")


def kept(store: OrderedDict[Hashable, V], key: Hashable, make: Callable[[], V], limit: int) -> V:
    """``store[key]``, made by ``make()`` when missing; beyond ``limit`` entries the least
    recently used go."""
    if key in store:
        store.move_to_end(key)
        return store[key]
    value = store[key] = make()
    while len(store) > limit:
        store.popitem(last=False)
    return value
