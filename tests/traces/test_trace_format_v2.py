"""Trace format version 2 (sim/traces/codec.py): the same arrays as version 1, smaller, and a
one-line error for every corrupt chunk."""

from __future__ import annotations

import json
import struct
import zipfile
from dataclasses import replace
from pathlib import Path

import engine_helpers as h
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_helpers import assert_same_arrays, random_trace

from sim.cli import main
from sim.errors import SimError
from sim.traces import codec
from sim.traces.format import Trace
from sim.traces.params import SynthDims
from sim.traces.synth import synth_trace


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_layers=st.integers(1, 3), n_neurons=st.integers(1, 700),
       n_experts=st.integers(1, 4), top_k=st.integers(1, 4), n_tokens=st.integers(0, 11),
       chunk_tokens=st.integers(1, 5), density=st.floats(0.0, 1.0), predictions=st.booleans())
def test_version_2_and_version_1_files_hold_the_same_arrays(tmp_path_factory, seed, n_layers, n_neurons, n_experts,
                                                             top_k, n_tokens, chunk_tokens, density, predictions):
    """Wide, sparse rows exercise the gap escape (gaps of 255 and more), dense ones the merges."""
    trace = random_trace(np.random.default_rng(seed), n_layers=n_layers, n_neurons=n_neurons,
                         n_experts=n_experts, top_k=min(top_k, n_experts), n_tokens=n_tokens,
                         chunk_tokens=chunk_tokens, density=density, predictions=predictions)
    tmp = tmp_path_factory.mktemp("v2")
    v1, v2 = Trace.load(trace.save(tmp / "v1.npz", version=1)), Trace.load(trace.save(tmp / "v2.npz"))
    assert (v1.meta.version, v2.meta.version) == (1, 2)
    assert replace(v1.meta, version=2) == v2.meta == replace(trace.meta, version=2)
    assert_same_arrays(v2, trace)
    assert_same_arrays(v2, v1)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The same small persistent synthetic trace (with predictions) as version 1 and 2, and its model."""
    folder = tmp_path_factory.mktemp("pair")
    model = h.model()
    trace = synth_trace(h.params(), SynthDims.from_model(model), 40, seed=3, chunk_tokens=16).materialise()
    return (trace.save(folder / "v1.npz", version=1), trace.save(folder / "v2.npz"),
            h.write_yaml(folder / "tiny-moe.yaml", h.TINY_MOE))


def test_version_2_is_much_smaller_on_persistent_activity(pair):
    v1, v2, _ = pair
    assert v2.stat().st_size * 3 < v1.stat().st_size


def test_trace_stats_are_identical_for_both_versions(pair, capsys):
    v1, v2, _ = pair
    assert main(["trace", "stats", str(v1), "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(["trace", "stats", str(v2), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == one


@pytest.mark.parametrize("mode", ["des", "analytic"])
def test_sim_run_results_are_identical_for_both_versions(pair, capsys, mode):
    v1, v2, model = pair
    out = []
    for path in (v1, v2):
        assert main(["run", "--model", str(model), "--trace", str(path), "--decode-tokens", "16", "--warmup-tokens",
                     "4", "--profile-tokens", "8", "--prompt-tokens", "8", "--offload", "0.5", "--mode", mode,
                     "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        result.pop("wall_s")
        result["config"].pop("trace")
        out.append(result)
    assert out[0] == out[1]


# -- corrupt version-2 files ---------------------------------------------------------------
def _rewrite_frame(src: Path, dst: Path, change) -> Path:
    """Copy ``src`` with chunk 0's frame passed through ``change(frame) -> frame``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            zout.writestr(name, change(data) if name == "c00000.zst" else data)
    return dst


def _payload(frame: bytes) -> bytearray:
    return bytearray(zstandard.ZstdDecompressor().decompress(frame))


def _frame(payload: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True).compress(bytes(payload))


def _error(path: Path) -> SimError:
    with pytest.raises(SimError) as info:
        for _ in Trace.load(path).chunks():
            pass
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    return info.value


def _sections(payload: bytearray) -> tuple[int, list[int]]:
    head = struct.calcsize("<4sIIIII")
    n = 5 if struct.unpack_from("<I", payload, 20)[0] & 1 else 3
    return head + 8 * n, [struct.unpack_from("<Q", payload, head + 8 * i)[0] for i in range(n)]


def _flip_byte(frame: bytes) -> bytes:
    raw = bytearray(frame)
    raw[len(raw) // 2] ^= 0xFF
    return bytes(raw)


def _id_out_of_range(frame: bytes) -> bytes:
    payload = _payload(frame)
    start, lengths = _sections(payload)
    gaps = start + lengths[0] + lengths[1]
    payload[gaps] = 254  # the first row's first id jumps by 254 (the test trace has 16 neurons)
    return _frame(payload)


def _count_too_big(frame: bytes) -> bytes:
    payload = _payload(frame)
    start, lengths = _sections(payload)
    struct.pack_into("<I", payload, start + lengths[0] + lengths[1] - 4, 10**6)  # the last row's count
    return _frame(payload)


def _bad_expert(frame: bytes) -> bytes:
    payload = _payload(frame)
    start, _ = _sections(payload)
    struct.pack_into("<h", payload, start, 9)
    return _frame(payload)


def _extra_byte(frame: bytes) -> bytes:
    payload = _payload(frame)
    start, lengths = _sections(payload)
    struct.pack_into("<Q", payload, start - 8 * len(lengths) + 8 * 2, lengths[2] + 1)  # the active gaps' length
    end = start + sum(lengths[:3])
    return _frame(bytes(payload[:end]) + b"\0" + bytes(payload[end:]))


def _huge_declared(frame: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))  # 64 MiB where a few KiB fit


@pytest.mark.parametrize("change, message", [
    (_flip_byte, "cannot decompress"), (_id_out_of_range, "ids must be in [0, n_neurons=16)"),
    (_count_too_big, "ids must be in [0, n_neurons=16)"), (_bad_expert, "expert ids must be in [0, 2)"),
    (_extra_byte, "bytes left over"), (_huge_declared, "declares 67108864 bytes"),
    (lambda frame: frame[: len(frame) // 2], "cannot decompress"),
])
def test_a_corrupt_chunk_is_a_one_line_error(tmp_path, change, message):
    rng = np.random.default_rng(5)
    trace = random_trace(rng, n_layers=2, n_neurons=16, n_experts=2, top_k=1, n_tokens=6, chunk_tokens=4,
                         density=0.4, predictions=True)
    good = trace.save(tmp_path / "good.npz")
    assert message in str(_error(_rewrite_frame(good, tmp_path / "bad.npz", change)))


def test_a_missing_chunk_or_a_container_that_contradicts_the_version_is_refused(tmp_path):
    trace = random_trace(np.random.default_rng(2), n_tokens=9, chunk_tokens=4)
    good = trace.save(tmp_path / "good.npz")
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(tmp_path / "short.npz", "w") as zout:
        for name in zin.namelist():
            if name != "c00002.zst":
                zout.writestr(name, zin.read(name))
    with pytest.raises(SimError, match=r"member c00002\.zst is missing"):
        Trace.load(tmp_path / "short.npz")
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(tmp_path / "v1.npz", "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            zout.writestr(name, json.dumps({**json.loads(data), "version": 1}) if name == "meta.json" else data)
    with pytest.raises(SimError, match="says version 1 but is laid out as version 2"):
        Trace.load(tmp_path / "v1.npz")


def test_an_unknown_write_version_is_refused(tmp_path):
    trace = random_trace(np.random.default_rng(2))
    with pytest.raises(SimError, match="version: must be one of 1, 2, got 3"):
        trace.save(tmp_path / "t.npz", version=3)
    assert not list(tmp_path.iterdir())


def test_payload_limit_covers_every_valid_chunk():
    """The bound a frame's declared size is checked against holds the densest chunk."""
    trace = random_trace(np.random.default_rng(9), n_layers=2, n_neurons=40, n_experts=2, top_k=2, n_tokens=4,
                         chunk_tokens=4, density=1.0, predictions=True)
    chunk = next(iter(trace.chunks()))
    frame = codec.encode_chunk(chunk, trace.meta)
    assert len(_payload(frame)) <= codec.max_payload_bytes(trace.meta, 4)
