"""Unit labels, energy accounting and the one-line refusals a first user ran into.

- A thread's label names its CPU cluster for any cluster name, so energy and a sweep's
  per-kind columns find the cluster (a cluster called ``x4`` was charged 0 W before).
- No CPU cluster is charged for more than all its cores busy for the whole run.
- A plan for energy on a phone without power figures, and a cache policy given twice with
  different values, are refused in one line.
- `sim memory --strategy` shows the layout that strategy's run uses.
- A run on a given trace that profiles hot neurons on the decoded tokens (the default)
  says the profile is an oracle.
"""

from __future__ import annotations

import json
import re

import engine_helpers as h
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.engine.simulation import simulate
from sim.engine.unit_labels import compute_label, io_label, unit_kind
from sim.errors import SimError
from sim.explore.worker import flatten_summary

CLUSTER_NAME = st.from_regex(re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,8}"), fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(CLUSTER_NAME, st.integers(0, 99))
def test_thread_labels_read_back_to_their_cluster(cluster, index):
    assert unit_kind(compute_label(cluster, index)) == (f"cpu:{cluster}", cluster)
    assert unit_kind(io_label(index, cluster)) == (f"io:{cluster}", cluster)


def _renamed(old: str, new: str):
    data = h.device_data()
    for c in data["cpu"]["clusters"]:
        if c["name"] == old:
            c["name"] = new
    return h.device(data)


def _run(device, strategy="powerinfer2", **kw):
    m = h.model(h.TINY_MOE)
    return simulate(device, m, strategy, trace=h.trace(m, 14), decode_tokens=10, prompt_tokens=8, warmup_tokens=4,
                    offload=0.5, **kw)


def test_a_cluster_named_with_a_trailing_digit_is_charged_its_power():
    stock = _run(h.device())
    renamed = _run(_renamed("big", "x4"))
    assert any(unit.startswith("cpu:x4-") for unit in renamed.summary["utilisation"])
    assert renamed.summary["energy_j_per_token"] == pytest.approx(stock.summary["energy_j_per_token"], rel=1e-12)
    flat = flatten_summary(renamed.summary)
    assert "utilisation.cpu:x4" in flat and "utilisation.cpu:x" not in flat


def test_no_cluster_is_charged_beyond_its_cores_for_the_whole_run():
    """32 reader threads on a few cores: the energy stays within every unit at full power."""
    dev = h.device()
    m = h.model(h.TINY_MOE)
    result = simulate(dev, m, "llm-in-flash", trace=h.trace(m, 14), decode_tokens=10, prompt_tokens=8,
                      warmup_tokens=4, offload=0.9, knobs={"window_k": 0, "bundling": False})
    p = dev.power
    decode_s = result.tokens["latency_s"].sum()
    n = len(result.tokens)
    full = sum((c.active_w or 0.0) * c.cores for c in dev.cpu.clusters) + (dev.storage.active_w or 0.0)
    full += sum((acc.active_w or 0.0) for acc in (dev.npu, dev.gpu) if acc is not None)
    bound = (p.idle_w + full) * decode_s + p.dram_w_per_gbps * result.summary["dram_bytes_per_token"] * n / 1e9
    assert result.summary["energy_j_per_token"] * n <= bound * (1 + 1e-12)
    # Each cluster's threads (compute and readers) keep at most its cores busy.
    per_cluster: dict[str, float] = {}
    for unit, frac in result.summary["utilisation"].items():
        cluster = unit_kind(unit)[1]
        if cluster is not None:
            per_cluster[cluster] = per_cluster.get(cluster, 0.0) + frac
    for c in dev.cpu.clusters:
        assert per_cluster.get(c.name, 0.0) <= c.cores + 1e-9, (c.name, per_cluster)
    assert per_cluster["big"] > 0.5  # the one big core computes and issues reads for most of the run


def test_sweeps_group_prefill_utilisation_by_kind_as_they_do_decode():
    flat = flatten_summary(_run(h.device()).summary)
    assert not [k for k in flat if re.match(r"(prefill_)?utilisation\.cpu:[a-z-]+\d", k)]
    assert any(k.startswith("prefill_utilisation.") for k in flat)


def test_a_cache_policy_given_twice_must_agree():
    with pytest.raises(SimError, match="s3fifo contradicts knob policy=lru") as err:
        _run(h.device(), policy="s3fifo", knobs={"policy": "lru"})
    assert err.value.field == "--policy"
    assert _run(h.device(), policy="lru", knobs={"policy": "lru"}).summary["decode_tokens_per_s"] > 0


def test_planning_for_energy_needs_power_figures(capsys):
    args = ["plan", "--device", "pixel-8-pro", "--model", "turbosparse-mistral-7b", "--memory-budget", "4GB",
            "--objective", "energy"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --objective: pixel-8-pro's profile has no power figures") and "\n" not in err


@pytest.mark.parametrize("strategy", ["llamacpp", "llm-in-flash", "powerinfer2"])
def test_sim_memory_shows_the_layout_of_the_strategy_a_run_uses(capsys, strategy):
    common = ["--model", "turbosparse-mistral-7b", "--memory-budget", "6GB"]
    assert main(["memory", *common, "--strategy", strategy, "--context-tokens", "72", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert main(["run", *common, "--strategy", strategy, "--prompt-tokens", "64", "--decode-tokens", "8",
                 "--mode", "analytic", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)["memory"]
    assert shown["neuron_cache_bytes"] == ran["neuron_cache"]
    assert ("predictors" in shown["resident"]) == ("predictors" in ran)


def test_an_io_thread_is_charged_the_driver_work_of_its_requests_not_its_waiting():
    from sim.engine.metrics import _io_cpu_seconds

    dev = h.device()
    big, mid = dev.cpu.cluster("big"), dev.cpu.cluster("mid")
    page = dev.storage.page_bytes
    busy = {"io0:big": 1.0, "io1:mid": 3.0, "cpu:big0": 2.0, "storage": 4.0}
    out = _io_cpu_seconds(dev, busy, 1000)
    # requests shared by busy time (250 and 750), each at the core's 4 KiB issue time
    assert out["io0:big"] == pytest.approx(250 * page / (big.io_4k_gbps * 1e9))
    assert out["io1:mid"] == pytest.approx(750 * page / (mid.io_4k_gbps * 1e9))
    assert out["cpu:big0"] == 2.0 and out["storage"] == 4.0  # compute and the device itself: as busy
    # never more than the time the thread was busy
    assert _io_cpu_seconds(dev, busy, 10**12)["io0:big"] == 1.0
    assert _io_cpu_seconds(dev, busy, None) == busy  # the cost model counts no requests


def test_an_oracle_profile_by_default_is_said_out_loud():
    m = h.model(h.TINY_MOE)

    def warnings(strategy="powerinfer2", **kw):
        return simulate(h.device(), m, strategy, trace=h.trace(m, 14), decode_tokens=6, prompt_tokens=8,
                        warmup_tokens=4, offload=0.5, **kw).summary["warnings"]

    assert any("an oracle" in w for w in warnings())
    assert not any("an oracle" in w for w in warnings(profile_tokens=4))
    assert not any("an oracle" in w for w in warnings(profile_tokens=0))  # asked for knowingly
    assert not any("an oracle" in w for w in warnings("llm-in-flash"))  # keeps no profile
