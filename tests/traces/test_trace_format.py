"""sim/traces/format.py: exact round trips and a clean one-line error for every corrupt trace."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_helpers import assert_same_arrays, random_trace, valid_parts, write_raw_trace

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
        assert_same_arrays(loaded, trace)
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


# Fuzz: traces written by other tools (any integer dtype and byte order, lying .npy headers, odd
# metadata types). Each must load to the same arrays or fail in one line naming the file.

def _narrowest_fitting(arr: np.ndarray, draw_dtype: np.dtype) -> bool:
    info = np.iinfo(draw_dtype)
    return not arr.size or (int(arr.min()) >= info.min and int(arr.max()) <= info.max)


INT_DTYPES = st.sampled_from(["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"])
BYTE_ORDERS = st.sampled_from(["<", ">", "="])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), predictions=st.booleans(), top_k=st.integers(1, 2),
       kinds=st.dictionaries(st.sampled_from(["offsets", "ids", "experts", "pred_offsets", "pred_ids"]),
                             st.tuples(INT_DTYPES, BYTE_ORDERS)))
def test_any_integer_dtype_and_byte_order_loads_to_the_same_arrays(seed, predictions, top_k, kinds):
    """uint64 offsets (numba TypingError) and '>i4' ids ("Unsupported array dtype") crashed
    stats and runs: a reader sees the canonical dtypes whatever a version-1 file holds."""
    from trace_helpers import rewrite_members

    from sim.traces.stats import trace_stats

    trace = random_trace(np.random.default_rng(seed), n_experts=3, top_k=top_k, n_neurons=120,
                         predictions=predictions)

    def change(name: str, arr: np.ndarray) -> np.ndarray:
        kind = name[len("c00000_"):]
        if kind not in kinds:
            return arr
        code, order = kinds[kind]
        dtype = np.dtype(order + code)
        return arr.astype(dtype) if _narrowest_fitting(arr, dtype) else arr.astype(arr.dtype.newbyteorder(order))

    with tempfile.TemporaryDirectory() as tmp:
        plain = trace.save(Path(tmp) / "plain.npz", version=1)
        other = rewrite_members(plain, Path(tmp) / "other.npz", change)
        got, want = _arrays(Trace.load(other)), _arrays(Trace.load(plain))
        for g, w in zip(got, want, strict=True):
            for a, b in zip(g[1:], w[1:], strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.dtype == b.dtype and a.dtype.isnative and np.array_equal(a, b)
        assert trace_stats(Trace.load(other)) == trace_stats(Trace.load(plain))


def test_values_beyond_the_canonical_dtype_are_refused_not_wrapped(tmp_path):
    """uint64 offsets above int64's range would wrap negative on a cast."""
    meta, members = valid_parts()
    members["c00000_offsets"] = np.array([0, 2, 3, 5, 2**63], np.uint64)
    path = write_raw_trace(tmp_path / "t.npz", meta, members)
    message = _expect_one_line_error(path, on_read=True)
    assert "offsets holds 9223372036854775808, outside int64's range" in message


def _lying_header(path: Path, meta: dict, members: dict[str, np.ndarray], name: str, shape: tuple) -> Path:
    import json
    import zipfile
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, arr in members.items():
            with zf.open(f"{key}.npy", "w") as fh:
                if key == name:
                    np.lib.format.write_array_header_1_0(
                        fh, {"descr": arr.dtype.str, "fortran_order": False, "shape": shape})
                    fh.write(arr.tobytes())
                else:
                    np.lib.format.write_array(fh, arr, allow_pickle=False)
        with zf.open("meta.npy", "w") as fh:
            np.lib.format.write_array(fh, np.frombuffer(json.dumps(meta).encode(), np.uint8), allow_pickle=False)
    return path


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["c00000_offsets", "c00000_ids", "c00000_experts"]),
       shape=st.one_of(st.tuples(st.integers(0, 10**15)),
                       st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
                       st.tuples(st.integers(0, 50), st.integers(0, 4), st.integers(0, 3))))
def test_a_npy_header_that_cannot_be_true_is_a_corrupt_trace_not_an_allocation(name, shape):
    """A header declaring 10^12 ids made numpy try to allocate 3.64 TiB."""
    meta, members = valid_parts()
    with tempfile.TemporaryDirectory() as tmp:
        path = _lying_header(Path(tmp) / "t.npz", meta, members, name, shape)
        try:
            trace = Trace.load(path)
            chunks = list(trace.chunks())
        except SimError as err:
            assert "\n" not in str(err) and str(path) in str(err)
            declared = int(np.prod(shape, dtype=object)) * members[name].dtype.itemsize
            if declared > 10**6:
                assert "the trace is corrupt" in str(err)
        else:  # only a header that agrees with the data can load
            assert shape == members[name].shape
            assert np.array_equal(chunks[0].ids, members["c00000_ids"])


@pytest.mark.parametrize(("key", "value", "message"), [
    ("predictor", [1, 2], "meta.predictor: must be a JSON object, got [1, 2]"),
    ("has_predictions", "no", 'meta.has_predictions: must be true or false, got "no"'),
    ("has_predictions", 0, "meta.has_predictions: must be true or false, got 0"),
    ("extra", "x", 'meta.extra: must be a JSON object, got "x"'),
    ("model", 7, "meta.model: must be a string, got 7"),
    ("seed", 1.5, "meta.seed: must be an integer or null, got 1.5"),
    ("seed", True, "meta.seed: must be an integer or null, got true"),
    ("activation_threshold", "0.1", 'meta.activation_threshold: must be a number or null, got "0.1"'),
    ("n_tokens", True, "meta.n_tokens: must be an integer, got a boolean"),
])
def test_metadata_types_are_checked(tmp_path, capsys, key, value, message):
    """A list as meta.predictor raised AttributeError in `trace info`; "no" was read as true."""
    meta, members = valid_parts()
    path = write_raw_trace(tmp_path / "t.npz", {**meta, key: value}, members)
    assert message in _expect_one_line_error(path)
    assert main(["trace", "info", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_a_two_dimensional_experts_array_names_its_shape(tmp_path):
    meta, members = valid_parts()
    members["c00000_experts"] = np.zeros((2, 2), np.int16)
    message = _expect_one_line_error(write_raw_trace(tmp_path / "t.npz", meta, members), on_read=True)
    assert "experts has shape (2, 2); expected (tokens, n_layers=2, top_k=1)" in message


def test_a_path_of_the_wrong_type_is_a_sim_error():
    with pytest.raises(SimError, match="expected a trace file path, got int"):
        Trace.load(123)  # type: ignore[arg-type]
