"""A compiled kernel that numba cannot read back from its on-disk cache.

numba keeps every ``@njit(cache=True)`` kernel compiled in ``__pycache__`` (or under
``NUMBA_CACHE_DIR``), keyed by a hash of the source file and the function's bytecode. A
process that imported one version of a module and compiled after the file changed (a
``git pull`` or an edit during a long sweep, in an editable install) can leave a data
file that the index of the new version points at but that does not unpickle. From then
on every run that needs the kernel stops in numba's loader, whatever the input.

numba itself treats a data file that has vanished as a cache miss and recompiles, so
deleting the unreadable file is the whole repair: :func:`repair` finds it in the
exception's traceback and removes it, and the CLI says so in one line instead of a
traceback (a sweep records the point as failed with that line, and its next points
recompile the kernel).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType

_LOADER = os.path.join("numba", "core", "caching.py")


def unreadable_cache_file(exc: BaseException) -> Path | None:
    """The cache data file numba was reading when ``exc`` was raised, or None if it was not
    raised while numba loaded a cached kernel (its cause's traceback counts too)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb: TracebackType | None = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code.co_filename.endswith(_LOADER) and frame.f_code.co_name == "_load_data":
                owner, name = frame.f_locals.get("self"), frame.f_locals.get("name")
                data_path = getattr(owner, "_data_path", None)
                if callable(data_path) and isinstance(name, str):
                    return Path(data_path(name))
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return None


def repair(exc: BaseException) -> str | None:
    """If ``exc`` comes from an unreadable cached kernel, delete that file and return the
    one-line message for the user; otherwise None (the exception is not ours to explain)."""
    path = unreadable_cache_file(exc)
    if path is None:
        return None
    removed = False
    with contextlib.suppress(OSError):
        path.unlink()
        removed = True
    what = f"numba's cached compiled kernel is unreadable ({type(exc).__name__}: {' '.join(str(exc).split())})"
    if removed:
        return f"{path}: {what}; removed it, so the kernel is compiled afresh: run the command again"
    return (f"{path}: {what}, and it could not be removed; delete it (or the *.nbi and *.nbc files in "
            f"{path.parent}) and run the command again")
