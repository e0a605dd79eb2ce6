"""Compiled inner loops of the version-2 trace codec (numba), see :mod:`sim.traces.codec`.

A set of rows (the active sets, or the predicted sets' difference from them) is stored as,
per row, the symmetric difference from the previous row of the same pool (layer, expert)
in the chunk, written as gaps between consecutive ids. Rows are sorted and unique, so both
directions are merges of two sorted lists: linear in the ids, whatever the FFN width.

Gap bytes: ``v = id - previous id - 1`` (``previous`` is -1 at a row's start), one byte when
``v < 255``, else the byte 255 and ``v`` as four little-endian bytes. A decoder that reads
any byte string therefore gets strictly increasing ids; it only has to check the stream's
end and the ids' range, which it reports as a status code instead of raising.
"""

from __future__ import annotations

import numba as nb
import numpy as np

ESCAPE = 255
OK, TRUNCATED, OUT_OF_RANGE = 0, 1, 2


@nb.njit(cache=True)
def _room(buf, used, need):
    """``buf`` itself if it has ``need`` entries, else a copy of its first ``used`` in a bigger one."""
    if need <= buf.shape[0]:
        return buf
    out = np.empty(max(need, 2 * buf.shape[0]), buf.dtype)
    for i in range(used):
        out[i] = buf[i]
    return out


@nb.njit(cache=True, inline="always")
def _xor_into(x, i, ie, y, j, je, out, n):
    """Append the symmetric difference of sorted ``x[i:ie]`` and ``y[j:je]`` to ``out`` from
    ``n``; returns the new end. Branch-free but for the loop: on this data (rows that mostly
    agree, differing at random places) a branch per id would mispredict every few ids."""
    while i < ie and j < je:
        a = np.int64(x[i])
        b = np.int64(y[j])
        out[n] = min(a, b)
        n += np.int64(a != b)
        i += np.int64(a <= b)
        j += np.int64(b <= a)
    while i < ie:
        out[n] = x[i]
        n += 1
        i += 1
    while j < je:
        out[n] = y[j]
        n += 1
        j += 1
    return n


@nb.njit(cache=True, nogil=True)
def xor_rows(a_off, a_ids, b_off, b_ids):
    """Row by row the symmetric difference of two CSR tables with the same rows (sorted ids)."""
    n_rows = a_off.shape[0] - 1
    off = np.zeros(n_rows + 1, np.int64)
    ids = np.empty(a_off[n_rows] + b_off[n_rows], np.int32)
    n = 0
    for r in range(n_rows):
        n = _xor_into(a_ids, a_off[r], a_off[r + 1], b_ids, b_off[r], b_off[r + 1], ids, n)
        off[r + 1] = n
    return off, ids[:n]


@nb.njit(cache=True, nogil=True)
def encode_rows(offsets, ids, pools, n_pools):
    """Per row the count of ids in its difference from its pool's previous row, and all the
    differences as gap bytes: (counts, bytes, bytes used)."""
    n_rows = offsets.shape[0] - 1
    last = np.full(n_pools, -1, np.int64)
    counts = np.zeros(n_rows, np.uint32)
    out = np.empty(offsets[n_rows] + 1024, np.uint8)
    diff = np.empty(0, np.int64)
    n = 0
    for r in range(n_rows):
        p = pools[r]
        ref = last[p]
        last[p] = r
        i, ie = offsets[r], offsets[r + 1]
        j, je = (offsets[ref], offsets[ref + 1]) if ref >= 0 else (0, 0)
        if diff.shape[0] < ie - i + je - j:
            diff = np.empty(2 * (ie - i + je - j), np.int64)
        c = _xor_into(ids, i, ie, ids, j, je, diff, 0)
        out = _room(out, n, n + 5 * c + 16)
        prev = -1
        for k in range(c):
            v = diff[k] - prev - 1
            prev = diff[k]
            if v < ESCAPE:
                out[n] = v
                n += 1
            else:
                out[n] = ESCAPE
                for b in range(4):
                    out[n + 1 + b] = (v >> (8 * b)) & 0xFF
                n += 5
        counts[r] = c
    return counts, out, n


@nb.njit(cache=True, nogil=True)
def decode_rows(counts, data, start, stop, pools, n_pools, n_neurons, capacity):
    """Invert :func:`encode_rows` from ``data[start:stop]``: (offsets, ids, bytes read, status).

    ``status`` is OK, TRUNCATED (the counts ask for more bytes than there are) or
    OUT_OF_RANGE (an id at or past ``n_neurons``); after an error the arrays are partial.
    """
    n_rows = counts.shape[0]
    last = np.full(n_pools, -1, np.int64)
    offsets = np.zeros(n_rows + 1, np.int64)
    ids = np.empty(max(capacity, 1), np.int32)
    diff = np.empty(n_neurons, np.int64)
    pos = start
    n = 0
    for r in range(n_rows):
        c = np.int64(counts[r])
        if c > n_neurons:
            return offsets, ids, pos - start, OUT_OF_RANGE
        prev = -1
        for k in range(c):
            if pos >= stop:
                return offsets, ids, pos - start, TRUNCATED
            v = np.int64(data[pos])
            pos += 1
            if v == ESCAPE:
                if pos + 4 > stop:
                    return offsets, ids, pos - start, TRUNCATED
                v = 0
                for b in range(4):
                    v |= np.int64(data[pos + b]) << (8 * b)
                pos += 4
            prev = prev + 1 + v
            diff[k] = prev
        if prev >= n_neurons:  # ids only grow within a row: the last one is the largest
            return offsets, ids, pos - start, OUT_OF_RANGE
        p = pools[r]
        ref = last[p]
        last[p] = r
        j, je = (offsets[ref], offsets[ref + 1]) if ref >= 0 else (0, 0)
        ids = _room(ids, n, n + n_neurons)
        n = _xor_into(diff, 0, c, ids, j, je, ids, n)
        offsets[r + 1] = n
    return offsets, ids, pos - start, OK
