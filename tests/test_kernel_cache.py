"""An unreadable numba cache file is removed and named in one line, not a traceback."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from sim import cli, kernel_cache

KERNEL = textwrap.dedent("""
    from numba import njit

    @njit(cache=True)
    def twice(x):
        return 2 * x
""")


def _load(path: Path, name: str):
    """A fresh import of ``path`` under ``name``: a new dispatcher, so numba reads its disk cache."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def corrupt_kernel(tmp_path):
    """A cached kernel whose data file holds garbage, as a process racing an edit can leave it."""
    source = tmp_path / "tiny_kernel.py"
    source.write_text(KERNEL)
    assert _load(source, "tiny_kernel_a").twice(3) == 6  # compiles and writes the cache
    (data,) = (tmp_path / "__pycache__").glob("*.nbc")
    data.write_bytes(b"not a pickle")
    try:
        yield source, data
    finally:
        for name in ("tiny_kernel_a", "tiny_kernel_b", "tiny_kernel_c"):
            sys.modules.pop(name, None)


def test_the_unreadable_file_is_found_removed_and_the_next_run_recompiles(corrupt_kernel):
    source, data = corrupt_kernel
    with pytest.raises(Exception) as info:
        _load(source, "tiny_kernel_b").twice(3)
    assert kernel_cache.unreadable_cache_file(info.value) == data
    message = kernel_cache.repair(info.value)
    assert message.startswith(f"{data}: numba's cached compiled kernel is unreadable (")
    assert "\n" not in message and not data.exists()
    assert _load(source, "tiny_kernel_c").twice(4) == 8  # recompiled, and cached again
    assert data.exists()


def test_the_cli_prints_one_line_and_exits_2(corrupt_kernel, monkeypatch, capsys):
    source, data = corrupt_kernel

    def command(**_kwargs):
        return _load(source, "tiny_kernel_b").twice(3)

    monkeypatch.setattr(cli, "app", command)
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {data}: ") and "run the command again" in err


def test_other_errors_are_not_explained_as_cache_trouble():
    try:
        raise ValueError("a bug elsewhere")
    except ValueError as exc:
        assert kernel_cache.unreadable_cache_file(exc) is None and kernel_cache.repair(exc) is None


def test_a_sweep_point_records_the_repair_as_its_error(corrupt_kernel):
    from sim.explore.worker import error_text

    source, data = corrupt_kernel
    with pytest.raises(Exception) as info:
        _load(source, "tiny_kernel_b").twice(3)
    assert error_text(info.value).startswith(f"{data}: numba's cached compiled kernel is unreadable")
    assert not data.exists()
