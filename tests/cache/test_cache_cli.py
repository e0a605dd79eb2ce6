"""`sim cache compare` end to end."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from cache_helpers import toy_trace

from sim.cli import main


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache") / "toy.npz"
    toy_trace(n_tokens=16).save(path)
    return path


def test_compare_trace_json_csv_and_plot(trace_file, tmp_path, capsys):
    out, plot = tmp_path / "res.csv", tmp_path / "mrc.png"
    code = main(["cache", "compare", "--trace", str(trace_file), "--policies", "lru,s3fifo,belady",
                 "--sizes", "5%,25%", "--json", "--out", str(out), "--plot", str(plot), "--neuron-bytes", "8KiB"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in rows} == {"lru", "s3fifo", "belady"} and len(rows) == 6
    assert {"policy", "capacity_bytes", "hits", "misses", "hit_ratio"} <= set(rows[0])
    assert pd.read_csv(out).shape[0] == 6
    assert plot.stat().st_size > 10_000
    ffn_bytes = 3 * 4 * 64 * 8192  # layers * experts * neurons * 8 KiB bundles
    assert sorted({r["capacity_bytes"] for r in rows}) == [round(0.05 * ffn_bytes), round(0.25 * ffn_bytes)]


def test_compare_requests_table(tmp_path, capsys):
    path = tmp_path / "r.csv"
    path.write_text("step,key,size\n" + "".join(f"{i},{i % 7},2\n" for i in range(50)))
    assert main(["cache", "compare", "--requests", str(path), "--policies", "lru,fifo", "--sizes", "4,50%"]) == 0
    text = capsys.readouterr().out
    assert "lru" in text and "fifo" in text and "hit ratio" in text


@pytest.mark.parametrize(("args", "message"), [
    ([], "exactly one of --trace"),
    (["--policies", "lru,nope"], "unknown policy 'nope'"),
    (["--sizes", "12 parsecs"], "--sizes"),
    (["--plot", "x.gif"], "x.gif: --plot: unsupported extension '.gif'; allowed: .png, .pdf, .svg"),
    (["--out", "x.xlsx"], "x.xlsx: --out: unsupported extension '.xlsx'; allowed: .csv, .parquet"),
    (["--sizes", "5%,1TB"], "--sizes: must be in [1, "),
    (["--split", "diagonal"], "split"),
])
def test_errors_are_one_line_with_status_2(trace_file, capsys, args, message):
    base = [] if args == [] else ["--trace", str(trace_file)]
    assert main(["cache", "compare", *base, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


def test_request_csv_rejects_trace_only_options(tmp_path, capsys):
    path = tmp_path / "r.csv"
    path.write_text("step,key\n0,1\n")
    assert main(["cache", "compare", "--requests", str(path), "--split", "per-layer"]) == 2
    assert "--split" in capsys.readouterr().err
