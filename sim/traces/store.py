"""The on-disk store of generated traces: each one made once and read back by every later run.

A synthetic trace is a pure function of the generator's code, its parameters, the model's
dimensions, the seed and the token counts, so a run, a sweep's worker processes and the
next day's commands can all share one copy instead of generating it again (a 208-token
TurboSparse-Mixtral-47B trace is ~10 MB in format version 2 and takes a few seconds to
generate). Entries are version-2 trace files named by a SHA-256 of everything that
determines the trace (:func:`trace_key`, which includes :data:`GENERATOR_VERSION` and a digest
of the generator's source files, so a changed generator never serves a stale trace).

Where: ``$PHONESIM_TRACE_CACHE`` if set (``off`` turns the store off), else ``traces/`` in
the user's cache folder (``platformdirs.user_cache_dir("phonesim")``, e.g.
``~/.cache/phonesim/traces``). ``sim cache-dir`` shows it and ``--clear`` empties it.

Safe with concurrent writers: a trace is written to a ``.part`` file of its own and renamed
into place, so readers only ever see whole files and two processes that generate the same
trace at once both leave a valid entry. Bounded: after each write the oldest entries (by
last use) go until the store holds at most ``$PHONESIM_TRACE_CACHE_BYTES`` (2 GiB by
default). An entry that cannot be read (truncated by a full disk, damaged) is removed and
the trace generated again, never a failed run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SimError
from sim.traces.format import Trace, TraceChunk, TraceWriter

ENV_DIR = "PHONESIM_TRACE_CACHE"
ENV_LIMIT = "PHONESIM_TRACE_CACHE_BYTES"
OFF = "off"
DEFAULT_LIMIT_BYTES = 2 * 1024**3
# Bump when the generator's output for the same inputs changes in a way its sources' digest
# would not show (a dependency's behaviour, say); source edits change the key by themselves.
GENERATOR_VERSION = 1
_GENERATOR_SOURCES = ("synth.py", "_synth_kernels.py", "params.py")
STALE_PART_S = 3600.0  # a .part file untouched this long belongs to a writer that died
SUFFIX = ".npz"


def store_dir() -> Path | None:
    """The store's folder, or None when ``$PHONESIM_TRACE_CACHE`` is ``off``."""
    raw = os.environ.get(ENV_DIR, "").strip()
    if raw.lower() == OFF:
        return None
    if raw:
        return Path(raw).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("phonesim", appauthor=False)) / "traces"


def limit_bytes() -> int:
    """The store's size bound, ``$PHONESIM_TRACE_CACHE_BYTES`` or 2 GiB."""
    raw = os.environ.get(ENV_LIMIT, "").strip()
    if not raw:
        return DEFAULT_LIMIT_BYTES
    from sim.units import parse_bytes

    try:
        value = parse_bytes(raw)
    except SimError:
        value = -1
    if value < 0:
        raise SimError(f"must be a size of at least 1 byte (such as 500MB or 2GiB), got {raw!r}", field=ENV_LIMIT)
    return int(value)


_DIGEST: str | None = None


def generator_digest() -> str:
    """A digest of what makes the generator's output: its version constant, its sources, numpy's
    version (its random streams and math feed the propensity tables) and the trace format."""
    global _DIGEST
    if _DIGEST is None:
        from sim.traces.format import FORMAT_VERSION

        h = hashlib.sha256(f"generator {GENERATOR_VERSION} format {FORMAT_VERSION} numpy {np.__version__}".encode())
        here = Path(__file__).parent
        for name in _GENERATOR_SOURCES:
            h.update((here / name).read_bytes())
        _DIGEST = h.hexdigest()
    return _DIGEST


def trace_key(params: Any, dims: Any, n_tokens: int, seed: int, chunk_tokens: int, predictions: bool | None,
              prompt_tokens: int = 0) -> str:
    """The store's name for a generated trace: a hash of everything it is a function of."""
    spec = {"generator": generator_digest(), "params": params.raw, "dims": asdict(dims), "n_tokens": n_tokens,
            "seed": seed, "chunk_tokens": chunk_tokens, "predictions": predictions, "prompt_tokens": prompt_tokens}
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def stored_synth_trace(params: Any, dims: Any, n_tokens: int, seed: int = 0, *, chunk_tokens: int = 64,
                       predictions: bool | None = None, prompt_tokens: int = 0) -> Trace:
    """:func:`sim.traces.synth.synth_trace`, read from the store when it holds the trace, else
    generated and written to the store as it is read (the first complete pass writes it)."""
    from sim.traces.params import SynthDims, resolve_params
    from sim.traces.synth import synth_trace

    params, dims = resolve_params(params), SynthDims.coerce(dims)

    def generate() -> Trace:
        return synth_trace(params, dims, n_tokens, seed, chunk_tokens=chunk_tokens, predictions=predictions,
                           prompt_tokens=prompt_tokens)

    folder = store_dir()
    if folder is None:
        return generate()
    limit_bytes()  # a bad bound is an error before any work, not after the trace is made
    path = folder / (trace_key(params, dims, n_tokens, seed, chunk_tokens, predictions, prompt_tokens) + SUFFIX)
    want = {"model": dims.model, "n_layers": dims.n_layers, "n_neurons": dims.n_neurons, "hidden": dims.hidden,
            "n_experts": dims.n_experts, "top_k": dims.top_k, "n_tokens": n_tokens, "seed": seed,
            "chunk_tokens": chunk_tokens, "prompt_tokens": prompt_tokens, "source": "synthetic"}
    stored = _open(path, want)
    return _Stored(stored, generate) if stored is not None else _Recording(generate(), path)


def _open(path: Path, want: Any) -> Trace | None:
    """The stored trace at ``path`` if there is one whose metadata agrees with ``want`` (a
    mapping of fields, or the metadata itself); an unreadable or foreign one is removed."""
    if not path.is_file():
        return None
    expected = want if isinstance(want, dict) else asdict(want)
    try:
        stored = Trace.load(path)
        if all(getattr(stored.meta, k) == v for k, v in expected.items() if k != "version"):
            os.utime(path)  # eviction goes by last use
            return stored
    except (SimError, OSError):
        pass
    path.unlink(missing_ok=True)  # to be made again
    return None


class _Stored(Trace):
    """A trace read from the store; if a chunk turns out unreadable, the entry is removed and
    the rest comes from the generator (the same chunks, so a run never notices)."""

    def __init__(self, stored: Trace, generate: Any):
        super().__init__(stored.meta, None, path=stored.path)
        self._stored, self._generate = stored, generate

    def chunks(self) -> Iterator[TraceChunk]:
        done = 0
        try:
            for chunk in self._stored.chunks():
                yield chunk
                done += 1
            return
        except SimError:
            assert self._stored.path is not None
            self._stored.path.unlink(missing_ok=True)
        for i, chunk in enumerate(self._generate().chunks()):
            if i >= done:
                yield chunk


class _Recording(Trace):
    """A generated trace that writes itself into the store while its first pass reads it.

    The file appears (renamed from its ``.part``) only when a pass has read every chunk; a
    pass that stops early leaves nothing. Later passes read the stored file, or generate
    again if it has gone (evicted by another process, say).
    """

    def __init__(self, source: Trace, path: Path):
        super().__init__(source.meta, None)
        self._source, self._store_path = source, path
        self._recording = False
        self._written = False

    def chunks(self) -> Iterator[TraceChunk]:
        stored = _open(self._store_path, self.meta) if self._written else None
        if stored is not None:
            yield from _Stored(stored, lambda: self._source).chunks()
            return
        if self._recording:  # another pass is writing it
            yield from self._source.chunks()
            return
        self._recording = True
        writer = None
        with contextlib.suppress(OSError):  # a store that cannot be written (read-only, full) only costs the reuse
            writer = TraceWriter(self._store_path, self.meta)
        done = False
        try:
            for chunk in self._source.chunks():
                # handed over before it is compressed: the run needs the chunk now, the store only
                # later (a first run's codec kernels compile while the engine works, not before)
                yield chunk
                if writer is not None:
                    try:
                        writer.add(chunk)
                    except OSError:  # the store filled up or went away mid-trace: only the reuse is lost
                        writer.abort()
                        writer = None
            done = True
        finally:
            if writer is not None:
                if done:
                    try:
                        writer.close()
                        self._written = True
                        evict(self._store_path.parent)
                    except OSError:
                        writer.abort()
                else:
                    writer.abort()
            self._recording = False


# -- the store as a whole ------------------------------------------------------------------
def entries(folder: Path | None = None) -> list[Path]:
    """The stored traces, oldest use first."""
    folder = store_dir() if folder is None else folder
    if folder is None or not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        if path.suffix == SUFFIX and path.is_file():
            try:
                found.append((path.stat().st_mtime, path))
            except OSError:
                continue
    return [p for _, p in sorted(found)]


def size_bytes(folder: Path | None = None) -> int:
    total = 0
    for path in entries(folder):
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


def evict(folder: Path, limit: int | None = None) -> list[Path]:
    """Remove the least recently used entries until the store holds at most ``limit`` bytes
    (and ``.part`` files left by writers that died); returns what was removed."""
    limit = limit_bytes() if limit is None else limit
    removed = []
    now = time.time()
    for path in folder.glob("*.part"):
        try:
            if now - path.stat().st_mtime > STALE_PART_S:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    sized = []
    for path in entries(folder):
        try:
            sized.append((path, path.stat().st_size))
        except OSError:
            continue
    total = sum(size for _, size in sized)
    for path, size in sized:
        if total <= limit:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        removed.append(path)
    return removed


def clear(folder: Path | None = None) -> int:
    """Remove every stored trace (and stray ``.part`` files); returns how many files went."""
    folder = store_dir() if folder is None else folder
    if folder is None or not folder.is_dir():
        return 0
    n = 0
    for path in [*entries(folder), *folder.glob("*.part")]:
        try:
            path.unlink()
            n += 1
        except OSError:
            continue
    return n
