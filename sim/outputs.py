"""Where results are written: output paths checked before the work, and strict JSON.

Used by the commands (``sim.commands``) and by library entry points that write files
(``sim.explore.sweep.run_sweep``), so both refuse a bad path the same way.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.errors import SimError

PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # figure formats every matplotlib backend writes


def check_suffix(path: Path, flag: str, suffixes: tuple[str, ...]) -> None:
    """Refuse an extension the writer does not understand (no check when ``suffixes`` is empty)."""
    if suffixes and path.suffix.lower() not in suffixes:
        raise SimError(f"unsupported extension {path.suffix or '(none)'!r}; allowed: {', '.join(suffixes)}",
                       source=str(path), field=flag)


def check_not_an_input(path: Path, flag: str, inputs: Mapping[str, Any]) -> None:
    """Refuse an output that is the same file (same inode: also through a link or another
    spelling of the path) as one of the command's inputs, which writing would destroy.
    ``inputs`` maps each input's flag to its value; names that are not files are skipped."""
    if not path.exists():
        return
    for in_flag, value in inputs.items():
        if value is None or not isinstance(value, str | os.PathLike):
            continue
        try:
            same = Path(value).is_file() and os.path.samefile(path, value)
        except (OSError, ValueError):
            continue
        if same:
            raise SimError(f"is the same file as the {in_flag} input; writing it would overwrite that input; "
                           "give another path", source=str(path), field=flag)


def check_output(path: Path | None, flag: str, *, suffixes: tuple[str, ...] = (), directory: bool = False,
                 inputs: Mapping[str, Any] | None = None) -> None:
    """Fail now, before any work, if ``path`` cannot be written as the ``flag`` output.

    A run that finishes and then cannot save is a result lost, so every command checks
    its output paths up front. Missing parent folders are created (as the writers do);
    a file is probed by opening it for append, which works as the writer will (root
    included, where permission bits say nothing) and leaves an existing file untouched.
    ``suffixes`` lists the extensions the writer understands (lower case, with the dot);
    ``inputs`` (flag -> value) the command's input files, which the output must not be.
    """
    if path is None:
        return
    path = Path(path)
    if not directory and path.is_dir():
        raise SimError("is a folder; give a file name", source=str(path), field=flag)
    check_not_an_input(path, flag, inputs or {})
    check_suffix(path, flag, suffixes)
    for parent in path.parents:  # the nearest that exists must be a folder (mkdir says only "File exists")
        if parent.exists():
            if not parent.is_dir():
                raise SimError(f"cannot write: {parent} is not a folder; give a path inside a folder",
                               source=str(path), field=flag)
            break
    try:
        if directory:
            if path.exists() and not path.is_dir():
                raise SimError("exists and is not a folder; give a folder to write into", source=str(path),
                               field=flag)
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".sim-write-probe"
            probe.touch()
            probe.unlink()
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with path.open("a"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        raise SimError(f"cannot write: {exc.strerror or exc}", source=str(path), field=flag) from None


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None, recursively (numpy scalars unwrapped).

    ``json.dumps`` writes NaN as a bare ``NaN``, which strict parsers (``jq``, browsers,
    most languages) reject; a missing figure is ``null`` in JSON.
    """
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        value = value.item()  # numpy scalar -> Python scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_text(data: Any, *, indent: int | None = 2) -> str:
    """Strict JSON for every ``--json`` output: NaN and infinities become null.

    Shared by every command module; ``allow_nan=False``
    turns any value that slipped past :func:`finite` into an error instead of bad JSON.
    """
    return json.dumps(finite(data), indent=indent, allow_nan=False, default=str)  # paths, enums: their text
