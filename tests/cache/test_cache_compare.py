"""Miss-ratio curves and the comparison plot."""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import toy_trace

from sim.cache import POLICY_NAMES
from sim.cache.compare import COLUMNS, compare_requests, compare_trace, parse_policies, resolve_sizes
from sim.errors import SimError
from sim.plots import plot_cache_comparison


@pytest.fixture(scope="module")
def curves():
    trace = toy_trace(n_tokens=32, seed=1)
    return trace, compare_trace(trace, "all", "5%,10%,25%,50%,100%", neuron_bytes=4)


def test_tidy_rows_for_every_policy_and_size(curves):
    trace, df = curves
    assert list(df.columns) == COLUMNS
    assert len(df) == len(POLICY_NAMES) * 5
    total = trace.meta.n_layers * trace.meta.n_experts * trace.meta.n_neurons * 4
    assert sorted(set(df["capacity_bytes"])) == [round(f * total) for f in (0.05, 0.10, 0.25, 0.5, 1.0)]
    np.testing.assert_allclose(df["capacity_pct"], 100 * df["capacity_bytes"] / total)
    assert (df["hits"] + df["misses"] == df["requests"]).all()
    np.testing.assert_allclose(df["hit_ratio"] + df["miss_ratio"], 1.0)
    np.testing.assert_allclose(df["flash_bytes_per_token"], df["loaded_bytes"] / trace.meta.n_tokens)


def test_belady_is_the_bound_on_the_curves(curves):
    _, df = curves
    bel = df[df["policy"] == "belady"].set_index("capacity_bytes")
    for policy, d in df[df["policy"] != "belady"].groupby("policy"):
        d = d.set_index("capacity_bytes")
        column = "loaded_bytes" if policy == "pi2-segmented" else "misses"  # pi2 prefetches clusters
        assert (bel[column] <= d[column]).all(), policy


def test_full_size_cache_only_has_compulsory_misses(curves):
    _, df = curves
    full = df[(df["capacity_pct"] == 100) & ~df["policy"].isin(["window", "pi2-segmented"])]
    assert full["misses"].nunique() == 1


def test_plot_has_one_line_per_policy_and_belady_dashed(curves, tmp_path):
    _, df = curves
    fig = plot_cache_comparison(df, tmp_path / "mrc.png", title="toy")
    assert (tmp_path / "mrc.png").stat().st_size > 10_000
    for ax in fig.axes:
        labels = [line.get_label() for line in ax.get_lines()]
        assert len(labels) == len(POLICY_NAMES)
        belady = [line for line in ax.get_lines() if line.get_label().startswith("belady")]
        assert belady[0].get_linestyle() == "--"


def test_requests_csv_curves(tmp_path):
    rng = np.random.default_rng(0)
    steps = np.repeat(np.arange(300), 2)
    keys = np.stack([rng.integers(0, 40, 300), 40 + rng.integers(0, 40, 300)], axis=1).reshape(-1)
    path = tmp_path / "r.csv"
    path.write_text("step,key\n" + "".join(f"{s},{k}\n" for s, k in zip(steps, keys, strict=True)))
    df = compare_requests(path, "lru,belady", "10,50%")
    assert df["capacity_bytes"].tolist() == [10, 40, 10, 40]
    assert (df["requests"] == 600).all()


def test_option_parsing_errors():
    with pytest.raises(SimError, match="unknown policy 'lruu'"):
        parse_policies("lru,lruu")
    with pytest.raises(SimError, match="--sizes"):
        resolve_sizes("5%,abc", 100)
    assert resolve_sizes("50%,10,2KiB", 10_000) == [10, 2048, 5000]
    assert resolve_sizes("100%,1000", 1000) == [1000]  # all items, as a share or in bytes, is the largest cache
    with pytest.raises(SimError, match=r"--sizes: must be in \[1, 1,000\] bytes .* got '2KiB' = 2,048 B"):
        resolve_sizes("50%,10,2KiB", 1000)
    with pytest.raises(SimError, match="granularity"):
        compare_trace(toy_trace(n_tokens=2), "pi2-segmented", "10%", granularity="cluster")


def test_warmup_tokens_are_served_but_not_counted(curves):
    from sim.cache.replay import replay_trace

    trace, _ = curves
    per_token = replay_trace(trace, "lru", 300).per_token
    df = compare_trace(trace, "lru", "300", warmup_tokens=8)
    counted = per_token[per_token["token"] >= 8]
    assert df["tokens"].item() == trace.meta.n_tokens - 8
    assert (df["requests"].item(), df["hits"].item()) == (counted["requests"].sum(), counted["hits"].sum())
    with pytest.raises(SimError, match="warmup"):
        compare_trace(trace, "lru", "300", warmup_tokens=trace.meta.n_tokens)


def test_comparison_options_go_to_the_policies_that_take_them():
    trace = toy_trace(n_tokens=6)
    df = compare_trace(trace, "lru,window", "20%", window_tokens=1)
    assert len(df) == 2
    with pytest.raises(SimError, match="no policy takes"):
        compare_trace(trace, "lru", "20%", windw_tokens=1)


def test_compare_trace_checks_its_arguments_and_takes_a_path(tmp_path):
    """A path was an AttributeError, 2.5 bytes per neuron was truncated, b"x" became a cache
    size, a float warm-up gave fractional token counts."""
    path = tmp_path / "t.npz"
    toy_trace(n_tokens=6).save(path)
    assert len(compare_trace(str(path), "lru", "10%,50%")) == 2
    for kwargs, field in (({"neuron_bytes": 2.5}, "--neuron-bytes"), ({"warmup_tokens": 2.5}, "--warmup-tokens"),
                          ({"policies": None}, "--policies"), ({"sizes": b"x"}, "--sizes")):
        with pytest.raises(SimError, match=f"^{field}: "):
            compare_trace(path, **{"policies": "lru", "sizes": "10%", **kwargs})
    with pytest.raises(SimError, match=r"^trace: expected a Trace"):
        compare_trace(5, "lru", "10%")
