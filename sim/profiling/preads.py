"""A batch of blocking ``pread`` calls in compiled code, with the GIL released.

The storage figures are fio's method (``--ioengine=psync``: each reader one blocking
request at a time; a queue depth is that many readers, as fio's ``--numjobs --thread``).
A Python loop around :func:`os.preadv` spends microseconds of interpreter time per 4 KiB
request and hands the GIL between threads after every one: at depth 32 on two cores
that reached 0.54-0.77x fio's rate (median 0.67x), as forked reader processes did too.
The same readers as threads each running :func:`read_batch` (libc's ``pread`` called
from a numba loop that holds no GIL) reached 0.79-1.17x (median 1.02x) in the same
minutes, because between two requests of a reader no Python runs at all.

libc's ``pread64`` is taken where it exists (glibc, bionic: a 64-bit offset on 32-bit
Android too), else ``pread`` (macOS, whose ``off_t`` is 64-bit). numba cannot cache a
kernel that calls a ctypes function, so it compiles once per process (about a second).
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numba as nb
import numpy as np

_LIBC = ctypes.CDLL(None, use_errno=True)
_pread = getattr(_LIBC, "pread64", None) or _LIBC.pread
# The buffer's address goes in as a size_t: numba passes an integer to it as is, and a
# pointer and a size_t are one register wide on every ABI the profiler runs on.
_pread.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]
_pread.restype = ctypes.c_ssize_t


@nb.njit(nogil=True)
def _read_offsets(fd: int, address: int, block: int, offsets: np.ndarray) -> int:
    moved = 0
    for i in range(offsets.size):
        got = _pread(fd, address, block, offsets[i])
        if got < 0:
            return -1 - i  # which request failed, for the caller to repeat and report
        moved += got
    return moved


class ReadBuffer:
    """A page-aligned buffer (``O_DIRECT`` requires it) of ``block`` bytes and its address."""

    def __init__(self, block: int):
        self.block = block
        self.memory = mmap.mmap(-1, block)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.memory))


def read_batch(fd: int, buf: ReadBuffer, offsets: np.ndarray) -> int:
    """Read ``buf.block`` bytes at each byte offset in ``offsets`` (int64) into ``buf``, one
    blocking request after the other; returns the bytes read. A failed request is repeated
    with :func:`os.preadv`, so the OSError raised carries its errno and message."""
    moved = _read_offsets(fd, buf.address, buf.block, offsets)
    if moved < 0:
        offset = int(offsets[-1 - moved])
        os.preadv(fd, [buf.memory], offset)  # raises the OSError the compiled call met
        raise OSError(f"pread of {buf.block} bytes at offset {offset} failed")
    return moved
