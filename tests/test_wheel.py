"""A real wheel, installed outside the checkout, finds every bundled data folder.

The profiles, presets and published figures live in top-level folders that ``setup.py``
maps into the package; an editable install (what the other tests use) resolves them in the
checkout even when the mapping is wrong, so only a built wheel shows whether they ship.
The test copies the project's files as a clone would have them, builds a wheel without
build isolation (no network), installs it with ``--no-deps`` into a fresh virtual
environment whose dependencies come from this one's site-packages (a ``.pth`` line, which
does not run this environment's editable-install hook), and runs README's command and
``sim profiles list`` from a directory outside the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

from sim.bundled import FOLDERS, bundled_dir

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", "__pycache__", "build", "dist", ".pytest_cache", ".ruff_cache", ".hypothesis"}


def _tracked_files() -> list[Path]:
    """The files a clone would have (tracked and new, not ignored); a plain walk without git."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()
        return [Path(name) for name in out.split("\0") if name and (ROOT / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p.relative_to(ROOT) for p in ROOT.rglob("*")
                if p.is_file() and not SKIP.intersection(p.relative_to(ROOT).parts)
                and not p.name.endswith(".egg-info")]


def _clone(dest: Path) -> None:
    for rel in _tracked_files():
        if rel.parts[0] in {"tests", "notebooks", "benchmarks", "examples", "docs", "traces"}:
            continue  # not part of the wheel; skipping them keeps the copy small
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_wheel_installed_elsewhere_finds_every_bundled_profile(tmp_path):
    src, wheels, venv, elsewhere = (tmp_path / name for name in ("src", "wheels", "venv", "elsewhere"))
    _clone(src)
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["COLUMNS"] = "200"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir",
          str(wheels), str(src)], tmp_path, env)
    (wheel,) = wheels.glob("phonesim-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
         tmp_path, env)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     elsewhere, env).strip())
    (site / "_phonesim_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = _run([str(python), "-c", "import sim, sim.bundled as b; print(sim.__file__); "
                  "print(*(b.bundled_dir(f) for f in b.FOLDERS), sep='\\n')"], elsewhere, env).split()
    assert Path(where[0]).is_relative_to(site), where[0]
    for folder, path in zip(FOLDERS, where[1:], strict=True):
        assert Path(path).is_relative_to(site), (folder, path)
        shipped = sorted(p.name for p in Path(path).glob("*.yaml"))
        assert shipped == sorted(p.name for p in bundled_dir(folder).glob("*.yaml")), folder

    sim_cli = str(venv / "bin" / "sim")
    listed = _run([sim_cli, "profiles", "list"], elsewhere, env)
    for folder in ("device_profiles", "model_profiles"):
        for profile in bundled_dir(folder).glob("*.yaml"):
            assert profile.stem in listed, profile.stem
    points = yaml.safe_load((bundled_dir("validation") / "published.yaml").read_text())["points"]
    n_points = _run([str(python), "-c", "from sim.validation import load_points; print(len(load_points()))"],
                    elsewhere, env)
    assert int(n_points) == len(points)

    out = _run([sim_cli, "run", "--decode-tokens", "4"], elsewhere, env)
    assert "turbosparse-mixtral-47b on oneplus-12" in out
    assert "decode_tokens_per_s" in out
