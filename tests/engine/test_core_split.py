"""sim/engine/strategies/base.py: the default compute / I/O core split (issue 18 item 7).

The rule that left the slowest cluster out computed on one prime core of a SoC with no little
cluster (2 prime + 6 performance cores, like Snapdragon 8 Elite): the split now comes from the
cores' speeds and from what the dedicated I/O thread leaves.
"""

from __future__ import annotations

import copy

import pytest
from engine_helpers import TINY_DENSE, device, device_data, model, trace
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.simulation import simulate
from sim.engine.strategies.base import LITTLE_SPEED_RATIO, default_core_split
from sim.profiles.registry import bundled_names, load_device


def _two_clusters(prime_cores: int, other_cores: int, other_speed: float) -> dict:
    """The OnePlus 12 with its CPU replaced by a prime cluster and a second cluster at
    ``other_speed`` of the prime's per-core rate (and I/O rate a little lower, as on the phones)."""
    data = device_data()
    big, mid = data["cpu"]["clusters"][0], data["cpu"]["clusters"][1]
    prime = dict(copy.deepcopy(big), name="prime", cores=prime_cores)
    other = dict(copy.deepcopy(mid), name="other", cores=other_cores,
                 int8_gops=round(big["int8_gops"] * other_speed, 3),
                 fp32_gflops=round(big["fp32_gflops"] * other_speed, 3))
    data["cpu"]["clusters"] = [prime, other]
    return data


def _rate(dev, cores: list[str]) -> float:
    speed = {c.name: c.int8_gops for c in dev.cpu.clusters}
    return sum(speed[c] for c in cores)


@pytest.mark.parametrize("other_speed", [0.82, 0.42])  # Oryon performance cores by clock; an A720 beside an X4
def test_no_fast_core_is_left_out_when_there_is_no_little_cluster(other_speed):
    dev = device(_two_clusters(2, 6, other_speed))
    compute, io = default_core_split(dev)
    assert sorted(compute) == sorted(["prime"] * (2 - io.count("prime")) + ["other"] * (6 - io.count("other")))


def test_the_default_split_is_faster_than_computing_beside_the_io_thread_alone():
    """The old default: one prime core computing beside the I/O thread on the other."""
    dev = device(_two_clusters(2, 6, 0.82))
    tiny = model(TINY_DENSE)
    tr = trace(tiny, 24)
    common = dict(device=dev, model=tiny, trace=tr, offload=0.5, prompt_tokens=4, decode_tokens=4,
                  warmup_tokens=4, profile_tokens=8)
    new = simulate(**common)
    old = simulate(**common, knobs={"compute_cores": ["prime"], "io_cores": ["prime"]})
    assert new.summary["decode_tokens_per_s"] > old.summary["decode_tokens_per_s"]


@pytest.mark.parametrize("name", bundled_names("device"))
def test_a_little_cluster_computes_only_when_the_rest_would_compute_less(name):
    """On the bundled phones the little cluster (A520s, efficiency cores) stays out of compute
    unless the other cores left beside the I/O thread compute less than it does."""
    dev = load_device(name)
    for needs_io in (True, False):
        compute, _ = default_core_split(dev, needs_io)
        slowest = min(dev.cpu.clusters, key=lambda c: c.int8_gops)
        fastest = max(c.int8_gops for c in dev.cpu.clusters)
        little = slowest.int8_gops <= LITTLE_SPEED_RATIO * fastest and len(dev.cpu.clusters) > 1
        others = [c for c in compute if c != slowest.name]
        if little and slowest.name in compute:
            assert _rate(dev, others) < slowest.int8_gops * compute.count(slowest.name)
        elif little:
            assert _rate(dev, others) >= slowest.int8_gops * slowest.cores


@settings(max_examples=60, deadline=None)
@given(clusters=st.lists(st.tuples(st.integers(1, 8), st.floats(1.0, 50.0), st.floats(0.3, 1.2)), min_size=1,
                         max_size=4), needs_io=st.booleans())
def test_the_default_never_idles_cores_that_would_out_compute_the_ones_it_uses(clusters, needs_io):
    """Whatever the CPU: every cluster but at most one computes, the I/O thread takes one
    core, and a cluster left out computes less than the cores used (or is little)."""
    data = device_data()
    template = data["cpu"]["clusters"][1]
    data["cpu"]["clusters"] = [dict(copy.deepcopy(template), name=f"c{i}", cores=n, int8_gops=g, io_4k_gbps=io)
                               for i, (n, g, io) in enumerate(clusters)]
    dev = device(data)
    compute, io = default_core_split(dev, needs_io)
    assert compute and len(io) == 1
    left_out = [c for c in dev.cpu.clusters if c.name not in compute and c.name not in io]
    assert len(left_out) <= 1
    fastest = max(c.int8_gops for c in dev.cpu.clusters)
    for c in left_out:
        assert c.int8_gops <= LITTLE_SPEED_RATIO * fastest
        assert c.int8_gops * c.cores <= _rate(dev, compute)
