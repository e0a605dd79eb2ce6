"""Durable, append-only storage of sweep rows: Parquet part files, then one compacted file.

A sweep writes ``results.parquet`` through three kinds of files next to it:

- ``results.parquet.parts/part-*.parquet``: finished rows, a few at a time. Each part is
  written to a hidden temporary file, flushed and ``fsync``-ed, renamed into place
  (atomic on POSIX) and the folder ``fsync``-ed, so a part either exists whole or not at
  all, whatever kills the process and whenever;
- ``results.parquet``: the compacted table, replaced the same way (write, fsync, rename);
  parts are deleted only after the compacted file that holds their rows is in place;
- ``results.parquet.lock``: an exclusive ``flock`` held while a sweep writes, so two
  sweeps never write one store (the kernel drops it when its holder dies).

Reading takes the compacted file plus every part and keeps one row per point id (an ``ok``
row over a ``failed`` one, then the earliest), so a crash between any two steps leaves a
readable store whose rows are never duplicated; a part that cannot be read is set aside
(renamed ``*.corrupt``) and its points simply run again.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sim.engine.config import run_options
from sim.errors import SimError

try:  # POSIX only; elsewhere the store works without the single-writer guard
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

FLUSH_ROWS = 64
FLUSH_INTERVAL_S = 1.0
ID = "point_id"


class ResultStore:
    """The rows of one results file; use as a context manager while writing."""

    def __init__(self, out: str | Path, *, flush_rows: int = FLUSH_ROWS, flush_interval_s: float = FLUSH_INTERVAL_S):
        self.out = Path(out)
        self.parts_dir = self.out.with_name(self.out.name + ".parts")
        self.lock_path = self.out.with_name(self.out.name + ".lock")
        self.flush_rows = flush_rows
        self.flush_interval_s = float(flush_interval_s)  # a numpy scalar would stop the flusher's waits
        self._buffer: list[dict[str, Any]] = []
        self._buffered_at = 0.0  # when the oldest buffered row arrived
        self._lock_fd: int | None = None
        self._seq = 0
        self.notes: list[str] = []
        # Rows become durable within flush_interval_s of finishing, even when the next row is
        # slow to come (one long point): a flusher thread commits them when they are due.
        self._cond = threading.Condition()
        self._flusher: threading.Thread | None = None
        self._stopping = False
        self._flush_error: BaseException | None = None

    # -- lifetime -------------------------------------------------------------------------------
    def __enter__(self) -> ResultStore:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_existing(self) -> None:
        """Refuse an ``out`` that holds anything but a sweep's results, before anything is written.

        Merging sweep rows into someone else's Parquet file would rewrite it; one without the
        store's columns could not even be read back as results.
        """
        if self.out.is_dir():
            raise SimError("is a folder; give a file name such as results.parquet", source=str(self.out),
                           field="--out")
        if not self.out.is_file():
            return
        try:
            names = set(pq.read_schema(self.out).names)
        except Exception as exc:
            raise self._unreadable(exc) from None
        missing = [c for c in (ID, "status") if c not in names]
        if missing:
            raise SimError(f"is not a sweep's results file (it has no {' or '.join(missing)} column); move it "
                           "away or choose another --out", source=str(self.out), field="--out")

    def open(self) -> None:
        self.check_existing()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.parts_dir.mkdir(exist_ok=True)
        fd = os.open(self.lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise SimError(f"another sweep is writing these results (lock {self.lock_path}); wait for it "
                               "to finish or choose another --out", source=str(self.out)) from None
        self._lock_fd = fd
        for folder in (self.parts_dir, self.out.parent):  # leftovers of writes a crash interrupted
            for tmp in folder.glob(f".{self.out.name}.tmp-*"):
                tmp.unlink(missing_ok=True)
            for tmp in folder.glob(".part-*.tmp"):
                tmp.unlink(missing_ok=True)
        if self.flush_interval_s > 0:
            self._stopping = False
            self._flusher = threading.Thread(target=self._flush_when_due, daemon=True, name="sweep-store-flush")
            self._flusher.start()

    def close(self) -> None:
        try:
            self._stop_flusher()
            self.flush()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

    def _stop_flusher(self) -> None:
        if self._flusher is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._flusher.join()
        self._flusher = None

    def _flush_when_due(self) -> None:
        """Commit buffered rows once the oldest has waited ``flush_interval_s`` (flusher thread).

        Whatever stops it (a full disk, say) is kept for the sweep's next append or close to
        raise: a flusher that died quietly would void the promise of durable rows.
        """
        try:
            with self._cond:
                while not self._stopping:
                    if not self._buffer:
                        self._cond.wait()
                        continue
                    wait = self._buffered_at + self.flush_interval_s - time.monotonic()
                    if wait > 0:
                        self._cond.wait(min(wait, threading.TIMEOUT_MAX))
                        continue
                    self._write_buffer()  # on failure the rows stay buffered
        except Exception as exc:
            self._flush_error = exc

    # -- writing --------------------------------------------------------------------------------
    def append(self, row: dict[str, Any]) -> None:
        """Buffer a finished row; it is durable within ``flush_interval_s`` (at once when that is 0,
        or when ``flush_rows`` are waiting)."""
        self._raise_flush_error()
        with self._cond:
            if not self._buffer:
                self._buffered_at = time.monotonic()
            self._buffer.append(row)
            if len(self._buffer) >= self.flush_rows or self.flush_interval_s <= 0:
                self._write_buffer()
            else:
                self._cond.notify_all()  # the flusher times the new row

    def flush(self) -> None:
        """Write buffered rows as one part file (durable once this returns)."""
        self._raise_flush_error()
        with self._cond:
            self._write_buffer()

    def _raise_flush_error(self) -> None:
        if self._flush_error is not None:
            exc, self._flush_error = self._flush_error, None
            raise SimError(f"cannot save finished rows ({type(exc).__name__}: {exc})", source=str(self.out))

    def _write_buffer(self) -> None:
        """Write the buffer as one part file; the caller holds ``_cond``."""
        if not self._buffer:
            return
        rows, self._buffer = self._buffer, []
        self._seq += 1
        name = f"part-{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}-{uuid.uuid4().hex[:8]}.parquet"
        try:
            _atomic_write(_to_arrow(rows), self.parts_dir / name,
                          self.parts_dir / f".{name.removesuffix('.parquet')}.tmp")
        except BaseException:  # e.g. Ctrl-C mid-write: the rows stay buffered for the next flush
            self._buffer = rows + self._buffer
            raise

    # -- reading --------------------------------------------------------------------------------
    def part_files(self) -> list[Path]:
        return sorted(self.parts_dir.glob("part-*.parquet")) if self.parts_dir.is_dir() else []

    def load(self) -> pd.DataFrame:
        """Every stored row, one per point id (compacted file plus committed parts)."""
        frames = []
        if self.out.is_file():
            self.check_existing()
            frames.append(self._read_compacted())
        frames += [df for df in (self._read_part(p) for p in self.part_files()) if df is not None]
        return dedupe(concat(frames)) if frames else pd.DataFrame({ID: []})

    def _read_compacted(self) -> pd.DataFrame:
        try:
            return _read(self.out)
        except Exception as exc:
            raise self._unreadable(exc) from None

    def _unreadable(self, exc: Exception) -> SimError:
        return SimError(f"cannot read the existing results ({type(exc).__name__}); move the file away or "
                        "choose another --out", source=str(self.out))

    def _read_part(self, path: Path) -> pd.DataFrame | None:
        try:
            return _read(path)
        except Exception as exc:  # a torn or foreign file: set aside, its points run again
            bad = path.with_name(path.name + ".corrupt")
            with contextlib.suppress(OSError):
                os.replace(path, bad)
            self.notes.append(f"set aside unreadable part {path.name} ({type(exc).__name__}); its points rerun")
            return None

    def finished_ids(self, *, include_failed: bool = True) -> set[str]:
        df = self.load()
        if df.empty or ID not in df:
            return set()
        if not include_failed and "status" in df:
            df = df[df["status"] == "ok"]
        return set(df[ID].astype(str))

    # -- compaction -----------------------------------------------------------------------------
    def compact(self, axes: pd.DataFrame | None = None, *, prune: bool = False) -> pd.DataFrame:
        """Merge everything into the results file and delete the parts it now holds.

        ``axes`` (``point_id`` plus one column per spec axis, in spec order) puts the current
        spec's points first, in its order, with its axis columns; rows of other points stay
        after them (sorted by id) unless ``prune``.
        """
        self._stop_flusher()
        self.flush()
        parts = self.part_files()
        stored = self.load()
        table = order_rows(stored, axes, prune=prune)
        _atomic_write(_to_arrow(table), self.out, self.out.with_name(f".{self.out.name}.tmp-{os.getpid()}"))
        for p in parts:
            p.unlink(missing_ok=True)
        _fsync_dir(self.parts_dir)
        with contextlib.suppress(OSError):  # empty now: tidy up (kept when it holds .corrupt files)
            self.parts_dir.rmdir()
        return read_results(self.out)


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Stack frames without pandas' silent casts (it turns ``False`` into ``0`` next to ints).

    A column whose dtypes differ between frames, other than ints next to floats, is stacked
    as Python objects; :func:`normalise_column` then decides its stored type.
    """
    dtypes: dict[str, set[str]] = {}
    for f in frames:
        for c in f.columns:
            dtypes.setdefault(c, set()).add(f[c].dtype.kind)
    loose = [c for c, kinds in dtypes.items() if len(kinds) > 1 and not kinds <= {"i", "u", "f"}]
    if loose:
        frames = [f.astype({c: object for c in loose if c in f.columns}) for f in frames]
    return pd.concat(frames, ignore_index=True)


def dedupe(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point id: the earliest ``ok`` row, else the latest failure (a retried
    point's newest error is the relevant one)."""
    if df.empty:
        return df
    failed = (df["status"] != "ok") if "status" in df else pd.Series(False, index=df.index)
    finished = pd.to_numeric(df["finished_at"], errors="coerce").fillna(0.0) if "finished_at" in df \
        else pd.Series(0.0, index=df.index)
    key = pd.DataFrame({"rank": failed.astype(int), "finished": finished.where(~failed, -finished),
                        "pos": range(len(df))}, index=df.index)
    order = key.sort_values(["rank", "finished", "pos"], kind="stable").index
    return df.loc[order].drop_duplicates(ID, keep="first").reset_index(drop=True)


def order_rows(stored: pd.DataFrame, axes: pd.DataFrame | None, *, prune: bool = False) -> pd.DataFrame:
    if axes is None or axes.empty:
        if stored.empty:
            return stored
        return stored.sort_values(ID, kind="stable")[canonical_columns(list(stored.columns))].reset_index(drop=True)
    axis_cols = [c for c in axes.columns if c != ID]
    in_spec = stored[stored[ID].isin(set(axes[ID]))] if not stored.empty else stored
    merged = axes.merge(in_spec.drop(columns=[c for c in axis_cols if c in in_spec.columns]), on=ID, how="inner")
    if not (prune or stored.empty):
        others = stored[~stored[ID].isin(set(axes[ID]))].sort_values(ID, kind="stable")
        if not others.empty:
            merged = pd.concat([merged, others], ignore_index=True)
    return merged[canonical_columns(list(merged.columns), axis_cols)].reset_index(drop=True)


# Column groups in the order a results table shows them; within "metrics" the headline
# figures come first. The order never depends on which point finished first.
# The configuration columns are RunConfig's fields (the profiles and strategy first, the trace
# or preset last as one "trace" column, knobs as knobs.<name> columns of their own).
CONFIG_COLUMNS = ("device", "model", "strategy",
                  *(k for k in run_options() if k not in ("device", "model", "strategy", "trace", "preset", "knobs")),
                  "trace")
_METRICS = ("decode_tokens_per_s", "prefill_tokens_per_s", "ttft_s", "latency_ms_mean", "latency_ms_p50",
            "latency_ms_p99", "energy_j_per_token", "cache_hit_ratio", "cache_miss_ratio_mean",
            "cache_miss_ratio_p99", "flash_bytes_per_token")
_META = ("project_version", "device_hash", "model_hash", "trace_source", "warnings")
_TIMING = ("wall_s", "finished_at", "worker")


def canonical_columns(columns: list[str], axis_cols: list[str] | None = None) -> list[str]:
    """A fixed order: id/status/error, axes, configuration, knobs, metrics, metadata, timing."""
    present = set(columns)
    ordered = [c for c in (ID, "status", "error", *(axis_cols or [])) if c in present]
    ordered += [c for c in CONFIG_COLUMNS if c in present and c not in ordered]
    ordered += sorted(c for c in present if c.startswith("knobs.") and c not in ordered)
    ordered += [c for c in _METRICS if c in present and c not in ordered]
    tail = set(_META) | set(_TIMING)
    ordered += sorted(c for c in present if c not in ordered and c not in tail)
    ordered += [c for c in (*_META, *_TIMING) if c in present and c not in ordered]
    return ordered


def read_results(path: str | Path) -> pd.DataFrame:
    """A results file as a DataFrame (plain pandas dtypes: integers with gaps read as floats).

    Rows a sweep has committed but not merged yet (its ``.parts`` folder, left by a sweep
    that is still running or was killed) are read too, so a plot never misses finished
    work; nothing is written or moved (``has_unmerged_parts`` tells a caller to say so).
    """
    if not isinstance(path, str | Path) or not str(path):
        raise SimError(f"expected a results file path (.parquet), got {path!r}", field="path")
    p = Path(path)
    store = ResultStore(p)
    parts = store.part_files()
    if not parts:
        if p.is_file():
            return _read_results_file(p)
        if store.parts_dir.is_dir():
            raise SimError(f"no finished rows yet ({store.parts_dir.name} is empty: the sweep stopped before its "
                           "first commit); run the sweep again to fill it", source=str(p))
        raise SimError("no such results file", source=str(p))
    # Parts first, then the compacted file: a sweep compacting meanwhile writes the file
    # before deleting parts, so a row is in one or the other (dedupe drops the doubles).
    frames = []
    for part in parts:
        with contextlib.suppress(Exception):  # merged away meanwhile, or torn: the sweep sets it aside
            frames.append(_read(part))
    if p.is_file():
        frames.append(_checked_read(p, _read))
    if not frames:
        raise SimError(f"no readable rows in {store.parts_dir.name}; run the sweep again", source=str(p))
    merged = order_rows(dedupe(concat(frames)), None)
    return _to_arrow(merged).to_pandas()


def has_unmerged_parts(path: str | Path) -> bool:
    """Whether a sweep left committed rows beside ``path`` that are not merged into it yet."""
    return bool(ResultStore(path).part_files())


def _read_results_file(p: Path) -> pd.DataFrame:
    return _checked_read(p, lambda q: pq.read_table(q).to_pandas())


def _checked_read(p: Path, reader: Any) -> pd.DataFrame:
    try:
        return reader(p)
    except Exception as exc:
        raise SimError(f"cannot read as Parquet ({type(exc).__name__}: {exc})", source=str(p)) from None


# -- Parquet plumbing ---------------------------------------------------------------------------

def _read(path: Path) -> pd.DataFrame:
    """Exact values: integer columns with missing entries stay Python ints (not floats)."""
    return pq.read_table(path).to_pandas(integer_object_nulls=True)


def _to_arrow(data: pd.DataFrame | list[dict[str, Any]]) -> pa.Table:
    if isinstance(data, pd.DataFrame):
        columns = {c: data[c].tolist() for c in data.columns}
    else:
        names = list(dict.fromkeys(k for row in data for k in row))
        columns = {c: [row.get(c) for row in data] for c in names}
    return pa.table({c: pa.array(normalise_values(v)) for c, v in columns.items()})


def normalise_values(values: list[Any]) -> list[Any]:
    """One type per column, decided by the values alone (never by how rows were batched).

    Missing values (None, NaN) become nulls; ints next to floats become floats; any other
    mix (text next to numbers, booleans next to numbers) becomes text.
    """
    kinds = {_kind(v) for v in values if not _missing(v)}
    if kinds <= {"int"} or kinds == {"bool"} or kinds == {"str"} or kinds == {"float"}:
        return [None if _missing(v) else (int(v) if kinds == {"int"} else v) for v in values]
    if kinds <= {"int", "float"}:
        return [None if _missing(v) else float(v) for v in values]
    return [None if _missing(v) else (v if isinstance(v, str) else _text(v)) for v in values]


def normalise_column(s: pd.Series) -> pd.Series:
    return pd.Series(normalise_values(s.tolist()), index=s.index, dtype=object)


def _kind(v: Any) -> str:
    if isinstance(v, bool | np.bool_):
        return "bool"
    if isinstance(v, numbers.Integral):  # beyond 64 bits Parquet has no integer for it: stored as text
        return "int" if -(2**63) <= int(v) < 2**63 else "other"
    if isinstance(v, numbers.Real):
        return "float"
    if isinstance(v, str):
        return "str"
    return "other"


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float | np.floating) and v != v)


def _text(v: Any) -> str:
    """Text of a value in a mixed column; a whole float reads like the int it may have been
    (batches that mixed ints with floats stored ``0`` as ``0.0``: the text must not differ)."""
    if isinstance(v, list | dict | tuple):
        return json.dumps(v, separators=(",", ":"), sort_keys=True, default=str)
    if isinstance(v, float | np.floating) and not isinstance(v, bool) and float(v).is_integer():
        return str(int(v))
    return str(v)


def _atomic_write(table: pa.Table, final: Path, tmp: Path) -> None:
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:  # interrupted or failed: no half-written file left behind
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(final.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on folders
        warnings.warn(f"cannot fsync folder {folder}", RuntimeWarning, stacklevel=2)
    finally:
        os.close(fd)
