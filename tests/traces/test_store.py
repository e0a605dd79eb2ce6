"""sim/traces/store.py: generated traces made once and read back, safely and within a bound."""

from __future__ import annotations

import json
import os
import threading
import time
import zipfile
from dataclasses import replace

import engine_helpers as h
import numpy as np
import pytest

from sim.cli import main
from sim.engine import simulation
from sim.traces import store
from sim.traces import synth as synth_module
from sim.traces.format import Trace
from sim.traces.params import SynthDims

DIMS = SynthDims.from_model(h.model())


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(store.ENV_DIR, str(tmp_path / "store"))
    monkeypatch.delenv(store.ENV_LIMIT, raising=False)
    return tmp_path / "store"


@pytest.fixture
def generated(monkeypatch) -> list[int]:
    """How many chunks the generator produced (each entry one chunk)."""
    made: list[int] = []
    original = synth_module.TraceSynthesizer.next_chunk

    def counting(self, n_tokens):
        made.append(n_tokens)
        return original(self, n_tokens)

    monkeypatch.setattr(synth_module.TraceSynthesizer, "next_chunk", counting)
    return made


def _read(trace: Trace) -> list[tuple]:
    return [(c.offsets, c.ids, c.experts, c.pred_offsets, c.pred_ids) for c in trace.chunks()]


def _equal(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for ca, cb in zip(a, b, strict=True)
                                    for x, y in zip(ca, cb, strict=True) if x is not None or y is not None)


def _stored(n_tokens: int = 20, seed: int = 1, **kw) -> Trace:
    return store.stored_synth_trace(h.params(), DIMS, n_tokens, seed, chunk_tokens=8, **kw)


def test_a_trace_is_generated_once_and_read_back_identically(folder, generated):
    first = _read(_stored())
    assert len(generated) == 3 and len(store.entries(folder)) == 1
    again = _read(_stored())
    assert len(generated) == 3  # nothing generated the second time
    assert _equal(again, first)
    assert _equal(first, _read(synth_module.synth_trace(h.params(), DIMS, 20, 1, chunk_tokens=8)))


def test_a_pass_that_stops_early_stores_nothing(folder):
    trace = _stored()
    chunks = trace.chunks()
    next(chunks)
    chunks.close()
    assert store.entries(folder) == [] and not list(folder.glob("*.part"))


@pytest.mark.parametrize("change", [{"seed": 2}, {"n_tokens": 21}, {"chunk_tokens": 4}, {"predictions": False},
                                    {"prompt_tokens": 3}, {"dims": replace(DIMS, n_neurons=512)},
                                    {"params": {"persistence": {"value": 0.5, "assumed": "test"}}}])
def test_the_key_covers_everything_the_trace_depends_on(change, monkeypatch):
    base = {"params": h.params(), "dims": DIMS, "n_tokens": 20, "seed": 1, "chunk_tokens": 8, "predictions": None,
            "prompt_tokens": 0}
    key = store.trace_key(**base)
    assert store.trace_key(**base) == key
    changed = dict(base, **change)
    if "params" in change:
        changed["params"] = replace(h.params(), raw={**h.params().raw, **change["params"]})
    assert store.trace_key(**changed) != key


def test_the_key_changes_with_the_generator(monkeypatch):
    args = (h.params(), DIMS, 20, 1, 8, None)
    key = store.trace_key(*args)
    monkeypatch.setattr(store, "_DIGEST", None)
    monkeypatch.setattr(store, "GENERATOR_VERSION", store.GENERATOR_VERSION + 1)
    assert store.trace_key(*args) != key


def test_two_writers_of_the_same_trace_both_leave_a_valid_entry(folder):
    """Two processes generating the same trace at once: each writes its own .part file and
    renames it over the entry, so the last one wins and both were whole."""
    a, b = _stored().chunks(), _stored().chunks()
    got_a, got_b = [], []
    for _ in range(3):
        got_a.append(next(a))
        got_b.append(next(b))
        assert len(list(folder.glob("*.part"))) == 2
    for it in (a, b):
        with pytest.raises(StopIteration):
            next(it)
    assert len(store.entries(folder)) == 1 and not list(folder.glob("*.part"))
    want = _read(synth_module.synth_trace(h.params(), DIMS, 20, 1, chunk_tokens=8))
    assert _equal(_read(Trace.load(store.entries(folder)[0])), want)


def _corrupt_chunk(path, index: int) -> None:
    with zipfile.ZipFile(path) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    frame = bytearray(members[f"c{index:05d}.zst"])
    frame[len(frame) // 2] ^= 0xFF
    members[f"c{index:05d}.zst"] = bytes(frame)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "middle chunk"])
def test_a_damaged_entry_is_made_again_not_a_failed_run(folder, generated, damage):
    want = _read(_stored())
    path = store.entries(folder)[0]
    if damage == "garbage":
        path.write_bytes(b"not a trace")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        _corrupt_chunk(path, 1)
    n = len(generated)
    assert _equal(_read(_stored()), want)
    assert len(generated) > n  # made again
    if damage != "middle chunk":  # a damage found at opening is replaced by the new copy at once
        assert _equal(_read(Trace.load(store.entries(folder)[0])), want)


def test_the_store_stays_within_its_bound_dropping_the_least_recently_used(folder, monkeypatch):
    _read(_stored(seed=1))
    one = store.size_bytes(folder)
    monkeypatch.setenv(store.ENV_LIMIT, str(int(2.5 * one)))
    _read(_stored(seed=2))
    time.sleep(0.01)
    _read(_stored(seed=1))  # used again: now the most recent
    first = store.entries(folder)[-1]
    _read(_stored(seed=3))
    kept = store.entries(folder)
    assert len(kept) == 2 and first in kept and store.size_bytes(folder) <= 2.5 * one
    assert all(store.trace_key(h.params(), DIMS, 20, 2, 8, None) not in p.name for p in kept)


def test_stale_part_files_go_but_a_live_writer_keeps_its_own(folder):
    folder.mkdir(parents=True)
    stale, fresh = folder / "x.npz.1-a.part", folder / "y.npz.2-b.part"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    old = time.time() - 2 * store.STALE_PART_S
    os.utime(stale, (old, old))
    store.evict(folder)
    assert not stale.exists() and fresh.exists()


def test_off_stores_nothing(tmp_path, monkeypatch, generated):
    monkeypatch.setenv(store.ENV_DIR, "off")
    _read(_stored())
    _read(_stored())
    assert len(generated) == 6 and store.store_dir() is None


def test_a_store_that_cannot_be_written_costs_only_the_reuse(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the store's folder would be")
    monkeypatch.setenv(store.ENV_DIR, str(blocker / "store"))
    want = _read(synth_module.synth_trace(h.params(), DIMS, 20, 1, chunk_tokens=8))
    assert _equal(_read(_stored()), want)


def test_a_store_that_fills_up_mid_trace_costs_only_the_reuse(folder, monkeypatch):
    def full(self, chunk):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.TraceWriter, "add", full)
    want = _read(synth_module.synth_trace(h.params(), DIMS, 20, 1, chunk_tokens=8))
    assert _equal(_read(_stored()), want)  # every chunk reaches the run
    assert store.entries(folder) == [] and not list(folder.glob("*.part"))  # and no partial file is left


def test_runs_share_the_stored_trace_and_agree(folder, monkeypatch):
    """The first run records the generated trace, a run in a fresh process (an empty in-process
    cache) opens it. Counted by which store object each run builds: a chunk count would also
    see read-ahead threads of other tests' traces still generating in this worker process."""
    monkeypatch.setattr(simulation, "_GENERATED", type(simulation._GENERATED)())
    built: list[str] = []
    for cls in (store._Recording, store._Stored):
        init = cls.__init__

        def spy(self, *args, _init=init, _name=cls.__name__, **kwargs):
            built.append(_name)
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", spy)
    kw = {"model": "llama-2-7b", "prompt_tokens": 2, "decode_tokens": 3, "warmup_tokens": 1, "profile_tokens": 2,
          "offload": 0.5}
    before = set(threading.enumerate())
    first = simulation.simulate(**kw).summary
    # this run's read-ahead thread reads the trace to its end and renames the stored file into
    # place, possibly just after the run has returned (it did after a busy CI machine's run)
    for thread in set(threading.enumerate()) - before:
        if thread.name == "trace-read-ahead":
            thread.join(timeout=30)
    assert built == ["_Recording"] and len(store.entries(folder)) == 1
    simulation._GENERATED.clear()  # as a new process would start
    second = simulation.simulate(**kw).summary
    assert built == ["_Recording", "_Stored"] and len(store.entries(folder)) == 1
    for key in ("decode_tokens_per_s", "cache_miss_ratio_mean", "flash_bytes_per_token"):
        assert second[key] == first[key]


def test_cache_dir_shows_and_clears_the_store(folder, capsys):
    _read(_stored())
    assert main(["cache-dir", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == str(folder) and info["entries"] == 1 and info["size_bytes"] == store.size_bytes(folder)
    assert info["limit_bytes"] == store.DEFAULT_LIMIT_BYTES
    assert main(["cache-dir"]) == 0
    assert str(folder) in capsys.readouterr().out
    assert main(["cache-dir", "--clear"]) == 0
    assert "removed 1 file" in capsys.readouterr().out and store.entries(folder) == []


def test_a_bad_bound_is_a_one_line_error(folder, capsys, monkeypatch):
    monkeypatch.setenv(store.ENV_LIMIT, "lots")
    assert main(["cache-dir"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PHONESIM_TRACE_CACHE_BYTES: must be a size" in err and "'lots'" in err
    assert main(["run", "--model", "llama-2-7b", "--decode-tokens", "2", "--prompt-tokens", "2"]) == 2
    assert "PHONESIM_TRACE_CACHE_BYTES" in capsys.readouterr().err
