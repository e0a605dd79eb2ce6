"""The result store: durable parts, compaction, deduplication, crash leftovers, one writer."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import SimError
from sim.explore.store import ResultStore, canonical_columns, dedupe, normalise_values, read_results


def row(i: int, status: str = "ok", finished: float = 0.0, **extra) -> dict:
    return {"point_id": f"p{i:03d}", "status": status, "error": None if status == "ok" else "boom",
            "decode_tokens_per_s": float(i), "finished_at": finished, **extra}


def test_rows_are_durable_after_flush_and_compaction_removes_parts(tmp_path):
    out = tmp_path / "r.parquet"
    with ResultStore(out, flush_rows=2, flush_interval_s=1e9) as store:
        for i in range(5):
            store.append(row(i))
        assert len(store.part_files()) == 2  # two full batches; the fifth row is still buffered
        assert len(ResultStore(out).load()) == 4  # what another reader sees right now
    assert len(ResultStore(out).load()) == 5  # closing flushed the last row
    with ResultStore(out) as store:
        df = store.compact()
    assert not (tmp_path / "r.parquet.parts").exists()
    assert list(df["point_id"]) == [f"p{i:03d}" for i in range(5)]
    assert read_results(out).equals(df)


def test_a_finished_row_is_committed_on_time_though_no_other_row_follows(tmp_path):
    """A sweep whose next point is slow must not hold the last finished row in memory: a
    crash (SIGKILL) then would lose it, against --commit-every's promise."""
    import time

    out = tmp_path / "r.parquet"
    with ResultStore(out, flush_interval_s=0.05) as store:
        store.append(row(1))
        store.append(row(2))
        deadline = time.monotonic() + 10.0  # generous on a loaded machine; normally ~0.05 s
        while not store.part_files() and time.monotonic() < deadline:
            time.sleep(0.01)
        # what a fresh process would find if this one were killed now
        assert sorted(ResultStore(out).load()["point_id"]) == ["p001", "p002"]
        store.append(row(3))
    assert sorted(ResultStore(out).load()["point_id"]) == ["p001", "p002", "p003"]


def test_a_crash_after_compaction_but_before_deleting_parts_duplicates_nothing(tmp_path):
    out = tmp_path / "r.parquet"
    with ResultStore(out, flush_rows=1) as store:
        for i in range(3):
            store.append(row(i))
        parts = [p.read_bytes() for p in store.part_files()]
        store.compact()
    # Put the parts back, as if the process died between the rename and the deletes.
    (tmp_path / "r.parquet.parts").mkdir()
    for i, blob in enumerate(parts):
        (tmp_path / "r.parquet.parts" / f"part-{i:020d}-1-000001-aaaaaaaa.parquet").write_bytes(blob)
    with ResultStore(out) as store:
        assert len(store.load()) == 3
        assert sorted(store.compact()["point_id"]) == ["p000", "p001", "p002"]


def test_interrupted_writes_and_torn_parts_are_ignored(tmp_path):
    out = tmp_path / "r.parquet"
    with ResultStore(out, flush_rows=1) as store:
        store.append(row(1))
    parts = tmp_path / "r.parquet.parts"
    (parts / ".part-00000000000000000009-1-000001-deadbeef.tmp").write_bytes(b"PAR1 half written")
    (parts / "part-00000000000000000009-1-000002-deadbeef.parquet").write_bytes(b"not parquet")
    (tmp_path / ".r.parquet.tmp-123").write_bytes(b"half a compaction")
    with ResultStore(out) as store:
        assert list(store.load()["point_id"]) == ["p001"]
        assert any("unreadable part" in n for n in store.notes)
        store.compact()
    assert not list(tmp_path.glob(".r.parquet.tmp-*"))
    assert list(read_results(out)["point_id"]) == ["p001"]


def test_a_write_interrupted_by_ctrl_c_leaves_no_temporary_and_loses_no_row(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    out = tmp_path / "r.parquet"
    real = pq.write_table
    calls = []

    def interrupted_once(table, where, **kw):
        calls.append(1)
        if len(calls) == 1:
            where.write(b"PAR1 half")
            raise KeyboardInterrupt
        return real(table, where, **kw)

    monkeypatch.setattr(pq, "write_table", interrupted_once)
    with ResultStore(out, flush_rows=2, flush_interval_s=1e9) as store:
        store.append(row(1))
        with pytest.raises(KeyboardInterrupt):
            store.append(row(2))  # the flush of rows 1 and 2 is interrupted mid-write
        assert not list((tmp_path / "r.parquet.parts").glob(".*.tmp"))
        df = store.compact()  # what run_sweep does after an interrupt
    assert list(df["point_id"]) == ["p001", "p002"]


def test_ok_row_wins_over_failed_then_the_first_success_or_the_last_failure():
    df = pd.DataFrame([row(1, "failed", 1.0), row(1, "ok", 5.0), row(1, "ok", 3.0), row(2, "failed", 2.0),
                       row(2, "failed", 1.0)])
    out = dedupe(df)
    assert list(out["point_id"]) == ["p001", "p002"]
    assert list(out["finished_at"]) == [3.0, 2.0]
    assert list(out["status"]) == ["ok", "failed"]


def test_only_one_writer_at_a_time(tmp_path):
    out = tmp_path / "r.parquet"
    with ResultStore(out), pytest.raises(SimError, match="another sweep is writing"):
        ResultStore(out).open()
    with ResultStore(out):  # released on close
        pass


def test_compaction_orders_by_spec_and_keeps_other_points_unless_pruned(tmp_path):
    out = tmp_path / "r.parquet"
    with ResultStore(out, flush_rows=1) as store:
        for i in (3, 1, 2, 9):
            store.append(row(i, strategy="x"))
        axes = pd.DataFrame({"point_id": ["p001", "p002", "p003"], "budget": ["8GB", "9GB", "10GB"]})
        df = store.compact(axes)
        assert list(df["point_id"]) == ["p001", "p002", "p003", "p009"]
        assert list(df.columns[:4]) == ["point_id", "status", "error", "budget"]
        assert list(store.compact(axes, prune=True)["point_id"]) == ["p001", "p002", "p003"]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False,
                                                                   width=32), st.text(max_size=4),
                          st.booleans()), min_size=1, max_size=8), st.integers(1, 4))
def test_any_column_mix_survives_a_parquet_round_trip(tmp_path_factory, values, flush_rows):
    out = tmp_path_factory.mktemp("mix") / "r.parquet"
    with ResultStore(out, flush_rows=flush_rows, flush_interval_s=1e9) as store:
        for i, v in enumerate(values):
            store.append({"point_id": f"p{i}", "status": "ok", "axis": v})
        df = store.compact()
    assert len(df) == len(values)
    for got, want in zip(df["axis"], normalise_values(values), strict=True):
        if want is None or (isinstance(want, float) and math.isnan(want)):
            assert got is None or (isinstance(got, float) and math.isnan(got)) or pd.isna(got)
        else:
            assert got == want


def test_canonical_columns_do_not_depend_on_arrival_order():
    cols = ["wall_s", "memory.kv_cache", "knobs.b", "decode_tokens_per_s", "strategy", "error", "point_id",
            "status", "knobs.a", "x", "project_version"]
    assert canonical_columns(cols, ["x"]) == canonical_columns(list(reversed(cols)), ["x"])
    assert canonical_columns(cols, ["x"])[:6] == ["point_id", "status", "error", "x", "strategy", "knobs.a"]


def test_a_parquet_file_that_is_not_sweep_results_is_refused_untouched(tmp_path):
    """--out pointing at a user's own Parquet file must not be merged into (rewritten) nor
    crash on its missing columns, and refusing it writes nothing beside it."""
    out = tmp_path / "mine.parquet"
    for frame in (pd.DataFrame({"a": [1, 2]}), pd.DataFrame({"point_id": ["x"], "a": [1]})):
        frame.to_parquet(out)
        before = out.read_bytes()
        with pytest.raises(SimError, match=r"mine.parquet: --out: is not a sweep's results file"):
            ResultStore(out).open()
        with pytest.raises(SimError, match="is not a sweep's results file"):
            ResultStore(out).load()
        assert out.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.parquet"]


def test_an_integer_beyond_64_bits_is_stored_as_text_not_lost(tmp_path):
    """Parquet has no integer type for it: the write failed after the points had run."""
    out = tmp_path / "r.parquet"
    with ResultStore(out, flush_rows=1) as store:
        store.append(row(1, seed=2**70))
    assert ResultStore(out).load()["seed"].tolist() == [str(2**70)]


def test_a_numpy_commit_interval_keeps_the_flusher_working(tmp_path):
    """commit_every_s=np.float32(...) stopped the flusher's waits, so rows were committed no more."""
    import time

    import numpy as np

    out = tmp_path / "r.parquet"
    with ResultStore(out, flush_interval_s=np.float32(0.05)) as store:
        store.append(row(1))
        deadline = time.monotonic() + 10.0
        while not store.part_files() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.part_files()
