"""Make the helper modules importable (pytest runs in importlib mode): each test folder's, and
those shared by several folders here (``arg_helpers``); and keep the tests' generated traces
out of the user's cache (:func:`pytest_configure`)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

for folder in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir() and not p.name.startswith("_")):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

STORE_ENV = "PHONESIM_TRACE_CACHE"
_saved: dict[str, str | None] = {}


def pytest_configure(config) -> None:
    """Runs keep generated traces in the on-disk store (sim.traces.store): point it at a folder of
    this session (each xdist worker its own) before anything is collected, so tests share their
    traces but never touch the user's cache. Set in the environment, so subprocesses (sweep
    workers, notebook kernels, `sim` itself) inherit it; removed when the session ends."""
    _saved["env"] = os.environ.get(STORE_ENV)
    _saved["dir"] = tempfile.mkdtemp(prefix="phonesim-test-traces-")
    os.environ[STORE_ENV] = _saved["dir"]


def pytest_unconfigure(config) -> None:
    if _saved.get("dir"):
        shutil.rmtree(_saved["dir"], ignore_errors=True)
    if _saved.get("env") is None:
        os.environ.pop(STORE_ENV, None)
    else:
        os.environ[STORE_ENV] = _saved["env"]  # type: ignore[assignment]
