"""sim/traces/format.py: exact round trips and a clean one-line error for every corrupt trace."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_helpers import random_trace, valid_parts, write_raw_trace

from sim.cli import main
from sim.errors import SimError
from sim.traces.format import FORMAT_VERSION, Trace, TraceMeta, check_dims, save_trace


def _arrays(trace: Trace) -> list[tuple]:
    return [(c.start, c.offsets, c.ids, c.experts, c.pred_offsets, c.pred_ids) for c in trace.chunks()]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_layers=st.integers(1, 3), n_neurons=st.integers(1, 40),
       n_experts=st.integers(1, 4), top_k=st.integers(1, 4), n_tokens=st.integers(0, 13),
       chunk_tokens=st.integers(1, 6), density=st.floats(0.0, 1.0), predictions=st.booleans())
def test_save_load_round_trips_exactly(seed, n_layers, n_neurons, n_experts, top_k, n_tokens, chunk_tokens,
                                       density, predictions):
    top_k = min(top_k, n_experts)
    trace = random_trace(np.random.default_rng(seed), n_layers=n_layers, n_neurons=n_neurons,
                         n_experts=n_experts, top_k=top_k, n_tokens=n_tokens, chunk_tokens=chunk_tokens,
                         density=density, predictions=predictions)
    with tempfile.TemporaryDirectory() as tmp:
        path = trace.save(Path(tmp) / "t.npz")
        loaded = Trace.load(path)
        assert loaded.meta == trace.meta
        got, want = _arrays(loaded), _arrays(trace)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g[0] == w[0]
            for a, b in zip(g[1:], w[1:], strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.dtype == b.dtype and np.array_equal(a, b)
        assert not list(Path(tmp).glob("*.part"))


def _expect_one_line_error(path: Path, *, on_read: bool = False) -> str:
    with pytest.raises(SimError) as info:
        trace = Trace.load(path)
        if on_read:
            for _ in trace.chunks():
                pass
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_truncated_file_is_a_clean_error(tmp_path):
    trace = random_trace(np.random.default_rng(1), n_tokens=20, chunk_tokens=4)
    path = trace.save(tmp_path / "t.npz")
    data = path.read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 30):
        bad = tmp_path / f"cut{cut}.npz"
        bad.write_bytes(data[:cut])
        assert "truncated" in _expect_one_line_error(bad, on_read=True)


def test_corrupt_compressed_member_is_a_clean_error(tmp_path):
    meta, members = valid_parts()
    members["c00000_ids"] = np.arange(5000, dtype=np.int32) % 8  # big enough to be deflated
    path = write_raw_trace(tmp_path / "t.npz", meta, members)
    raw = bytearray(path.read_bytes())
    start = raw.find(b"c00000_ids.npy") + 200
    raw[start:start + 40] = bytes(40)
    path.write_bytes(bytes(raw))
    _expect_one_line_error(path, on_read=True)


def test_wrong_version_is_a_clean_error(tmp_path):
    meta, members = valid_parts()
    meta["version"] = FORMAT_VERSION + 1
    msg = _expect_one_line_error(write_raw_trace(tmp_path / "t.npz", meta, members))
    assert "version" in msg


@pytest.mark.parametrize("defect, field", [
    ("ids_out_of_range", "ids"), ("negative_id", "ids"), ("non_monotone_offsets", "offsets"),
    ("offsets_not_from_zero", "offsets"), ("offsets_end_mismatch", "offsets"), ("unsorted_row", "ids"),
    ("dims_experts_shape", "experts"), ("dims_offsets_length", "offsets"), ("expert_out_of_range", "experts"),
    ("float_ids", "ids"), ("two_dim_ids", "ids"), ("token_count_mismatch", "experts"),
    ("missing_member", "ids"), ("pred_missing", "pred_offsets"),
])
def test_corrupt_chunk_is_a_clean_error(tmp_path, defect, field):
    meta, m = valid_parts()
    if defect == "ids_out_of_range":
        m["c00000_ids"][2] = 8
    elif defect == "negative_id":
        m["c00000_ids"][0] = -1
    elif defect == "non_monotone_offsets":
        m["c00000_offsets"] = np.array([0, 3, 2, 5, 6], np.int64)
    elif defect == "offsets_not_from_zero":
        m["c00000_offsets"] = np.array([1, 2, 3, 5, 6], np.int64)
    elif defect == "offsets_end_mismatch":
        m["c00000_offsets"] = np.array([0, 2, 3, 5, 5], np.int64)
    elif defect == "unsorted_row":
        m["c00000_ids"] = np.array([4, 1, 7, 0, 3, 5], np.int32)
    elif defect == "dims_experts_shape":
        m["c00000_experts"] = np.zeros((2, 3, 1), np.int16)
    elif defect == "dims_offsets_length":
        m["c00000_offsets"] = np.array([0, 2, 3, 5, 6, 6], np.int64)
    elif defect == "expert_out_of_range":
        m["c00000_experts"][0, 0, 0] = 1
    elif defect == "float_ids":
        m["c00000_ids"] = m["c00000_ids"].astype(np.float64) + 0.5
    elif defect == "two_dim_ids":
        m["c00000_ids"] = m["c00000_ids"].reshape(6, 1)
    elif defect == "token_count_mismatch":
        meta["n_tokens"] = 3
    elif defect == "missing_member":
        del m["c00000_ids"]
    elif defect == "pred_missing":
        meta["has_predictions"] = True
    path = write_raw_trace(tmp_path / "t.npz", meta, m)
    with pytest.raises(SimError) as info:
        for _ in Trace.load(path).chunks():
            pass
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert info.value.field == field


def test_valid_parts_are_valid(tmp_path):
    meta, members = valid_parts()
    trace = Trace.load(write_raw_trace(tmp_path / "t.npz", meta, members))
    assert [c.ids.tolist() for c in trace.chunks()] == [[1, 4, 7, 0, 3, 5]]
    assert trace.active(1, 0).tolist() == [0, 3]


def test_dims_mismatch_against_a_model_is_a_clean_error():
    trace = random_trace(np.random.default_rng(0), n_layers=2, n_neurons=12)
    check_dims(trace.meta, n_layers=2, n_neurons=12)
    with pytest.raises(SimError, match="n_neurons=12 but the model has 14336"):
        check_dims(trace.meta, n_layers=2, n_neurons=14336, source="t.npz")


def test_failed_write_leaves_no_partial_file(tmp_path):
    trace = random_trace(np.random.default_rng(0), n_tokens=8, chunk_tokens=4)
    chunks = list(trace.chunks())
    short = chunks[0].__class__(0, chunks[0].offsets[:5], chunks[0].ids[:chunks[0].offsets[4]],
                                chunks[0].experts[:2])
    with pytest.raises(SimError, match="only the last chunk"):
        save_trace(tmp_path / "t.npz", trace.meta, [short, chunks[1]])
    assert not list(tmp_path.iterdir())


def test_cli_reports_corrupt_trace_in_one_line(tmp_path, capsys):
    path = tmp_path / "t.npz"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["trace", "info", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and str(path) in err


def test_a_repeated_expert_in_a_layer_is_a_clean_error():
    """The engine relies on a layer's experts being distinct (its keys then come out sorted)."""
    meta = TraceMeta(model="hand", n_layers=1, n_neurons=10, hidden=8, n_experts=4, top_k=2, chunk_tokens=1)
    rows = [np.array([5, 7], np.int32), np.array([1, 6], np.int32)]
    with pytest.raises(SimError, match="same expert twice") as info:
        Trace.from_rows(meta, rows, np.array([[[2, 2]]], dtype=np.int16), None)
    assert info.value.field == "experts"


def test_from_rows_checks_what_it_is_given():
    """Metadata of zero layers divided by zero, float ids were truncated to other neurons,
    and a partial token's rows were dropped without a word."""
    import numpy as np
    import pytest

    from sim.errors import SimError
    from sim.traces.format import Trace, TraceMeta

    good = TraceMeta(model="t", n_layers=2, n_neurons=10, hidden=4)
    with pytest.raises(SimError, match="n_layers"):
        Trace.from_rows(TraceMeta(model="t", n_layers=0, n_neurons=10, hidden=4), [np.array([1])])
    with pytest.raises(SimError, match=r"^meta: expected a TraceMeta"):
        Trace.from_rows(None, [])
    with pytest.raises(SimError, match=r"^active: neuron ids must be integers"):
        Trace.from_rows(good, [np.array([1.5]), np.array([2])])
    with pytest.raises(SimError, match=r"^active: has 3 rows, not a whole number of tokens"):
        Trace.from_rows(good, [np.array([1])] * 3)
    assert Trace.from_rows(good, [np.array([1]), np.array([2, 3])]).meta.n_tokens == 1
