"""Bounded in-process memos: the value made once per key, the least recently used dropped.

Several parts keep costly results for the runs that follow in the same process (generated
traces, edited presets, run summaries, parsed files); each keeps only its last few, which is
this. A parsed file is keyed by :func:`file_version`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
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


def file_version(path: Path) -> tuple | None:
    """What a memo of a file's parse is keyed by: its resolved path, modification time and
    size (a rewritten file is another version); None when it cannot be read."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
