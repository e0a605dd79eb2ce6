"""The compiled pread batch (sim/profiling/preads.py) reads what os.pread reads, and fails as it does."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.profiling.preads import ReadBuffer, read_batch

FILE_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("preads") / "data.bin"
    path.write_bytes(np.random.default_rng(7).bytes(FILE_BYTES))
    fd = os.open(path, os.O_RDONLY)
    yield fd, path.read_bytes()
    os.close(fd)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([512, 4096, 8192]), st.lists(st.integers(0, 7), min_size=1, max_size=12))
def test_a_batch_reads_each_request_whole_and_leaves_the_last_in_the_buffer(data_file, block, slots):
    fd, content = data_file
    buf = ReadBuffer(block)
    offsets = np.array(slots, dtype=np.int64) * block
    assert read_batch(fd, buf, offsets) == block * len(slots)
    last = int(offsets[-1])
    assert bytes(buf.memory[:block]) == content[last:last + block]


def test_a_short_read_at_the_end_counts_the_bytes_it_got(data_file):
    fd, content = data_file
    buf = ReadBuffer(4096)
    assert read_batch(fd, buf, np.array([FILE_BYTES - 100], dtype=np.int64)) == 100
    assert bytes(buf.memory[:100]) == content[-100:]


def test_a_failed_request_raises_the_oserror_of_its_errno(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)  # a folder: read(2) fails with EISDIR
    try:
        with pytest.raises(OSError) as err:
            read_batch(fd, ReadBuffer(4096), np.array([0, 4096], dtype=np.int64))
        assert err.value.errno == errno.EISDIR
    finally:
        os.close(fd)
