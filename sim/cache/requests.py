"""Plain request streams (``step,key[,size]`` CSV) so policies can be compared on any
trace, and results checked against other cache simulators.

Rows with the same ``step`` form one step (in file order); steps run in increasing
``step`` order. Keys are any integers, unique within a step, and are renumbered densely
(the original keys are kept as ``ItemSpace.labels``). ``size`` is the key's size in
bytes (default 1) and must be the same on every row of a key.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.cache.layout import ItemSpace, RequestBlock
from sim.errors import SimError


def requests_from_arrays(steps: np.ndarray, keys: np.ndarray, sizes: np.ndarray | None = None, *,
                         source: str = "<requests>") -> tuple[ItemSpace, RequestBlock]:
    """Build a single-partition item space and block from parallel step/key/size arrays."""
    steps = np.asarray(steps, dtype=np.int64)
    keys = np.asarray(keys, dtype=np.int64)
    sizes = np.ones(keys.shape[0], dtype=np.int64) if sizes is None else np.asarray(sizes, dtype=np.int64)
    if not steps.shape == keys.shape == sizes.shape or steps.ndim != 1:
        raise SimError("step, key and size columns must have the same length", source=source)
    if sizes.size and sizes.min() < 1:
        bad = int(np.flatnonzero(sizes < 1)[0])
        raise SimError(f"size must be a positive byte count, row {bad + 1} has {int(sizes[bad])}", source=source,
                       field="size")
    order = np.argsort(steps, kind="stable")
    steps, keys, sizes = steps[order], keys[order], sizes[order]
    labels, items = np.unique(keys, return_inverse=True)
    items = items.astype(np.int64).reshape(-1)
    step_vals, step_idx = np.unique(steps, return_inverse=True)
    pair = np.lexsort((items, step_idx))
    dup = (items[pair][1:] == items[pair][:-1]) & (step_idx[pair][1:] == step_idx[pair][:-1])
    if dup.any():
        j = pair[1:][dup][0]
        raise SimError(f"key {int(keys[j])} appears twice in step {int(steps[j])}; keys must be unique within a step",
                       source=source, field="key")
    n_items = labels.shape[0]
    lo = np.full(n_items, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(n_items, dtype=np.int64)
    np.minimum.at(lo, items, sizes)
    np.maximum.at(hi, items, sizes)
    if np.any(lo != hi):
        k = int(np.flatnonzero(lo != hi)[0])
        raise SimError(f"key {int(labels[k])} has sizes {int(lo[k])} and {int(hi[k])}; a key must keep one size",
                       source=source, field="size")
    offsets = np.zeros(step_vals.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(step_idx, minlength=step_vals.shape[0]), out=offsets[1:])
    n_steps = step_vals.shape[0]
    space = ItemSpace(n_items, lo if n_items else np.zeros(0, np.int64), 1, int(lo.sum()) if n_items else 0,
                      n_steps, None, labels)
    block = RequestBlock(items, offsets, np.arange(n_steps, dtype=np.int64), np.zeros(n_steps, dtype=np.int64))
    return space, block


def read_requests_csv(path: str | Path) -> tuple[ItemSpace, RequestBlock]:
    """Read a ``step,key[,size]`` CSV; every problem is a one-line SimError."""
    path = Path(path)
    src = str(path)
    if not path.is_file():
        raise SimError("no such requests file", source=src)
    try:
        df = pd.read_csv(path, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        raise SimError(f"cannot read CSV ({' '.join(str(exc).split())})", source=src) from None
    df.columns = [str(c).strip().lower() for c in df.columns]
    missing = [c for c in ("step", "key") if c not in df.columns]
    if missing:
        raise SimError(f"missing column(s) {missing}; expected columns step,key[,size]", source=src)
    extra = sorted(set(df.columns) - {"step", "key", "size"})
    if extra:
        raise SimError(f"unknown column(s) {extra}; expected columns step,key[,size]", source=src)
    if df.empty:
        raise SimError("no requests", source=src)
    cols = {}
    for name in [c for c in ("step", "key", "size") if c in df.columns]:
        lo, hi, allowed = _INT_RANGES[name]
        col = pd.to_numeric(df[name], errors="coerce")
        if col.dtype.kind in "iu":  # read as integers: only the range can be wrong
            values = col.to_numpy()
            bad = (values < lo) | (values > hi)
        else:  # floats (1e30, 10.5) or text: check before any cast to int64 wraps or truncates
            values = col.to_numpy(dtype=float)
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(values) | (values != np.floor(values)) | (values < lo) | (values >= hi + 1.0)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise SimError(f"row {row + 1}: must be an integer in {allowed}, got {_shown(df[name].iloc[row])}",
                           source=src, field=name)
        cols[name] = col.to_numpy(dtype=np.int64)
    return requests_from_arrays(cols["step"], cols["key"], cols.get("size"), source=src)


# Allowed values per column: steps and keys are any int64 (keys are often 64-bit hashes); a size is
# a byte count of one item, at most 1 TiB (2**40), so sums over many items stay far inside int64.
_INT_RANGES = {"step": (-(2**63), 2**63 - 1, "[-2**63, 2**63)"), "key": (-(2**63), 2**63 - 1, "[-2**63, 2**63)"),
               "size": (1, 2**40, "[1, 2**40]")}


def _shown(value: object) -> str:
    """A cell as the user wrote it, without numpy's repr: ``1e+30``, ``10.5``, ``'abc'``, an empty cell."""
    if isinstance(value, str):
        return repr(value.strip())
    if pd.isna(value):
        return "an empty cell"
    return f"{float(value):g}" if isinstance(value, float | np.floating) else str(value)
