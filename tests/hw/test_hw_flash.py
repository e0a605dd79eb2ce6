"""Flash service times (sim.hw.flash) against the device profile they are built from.

Figures are read from the bundled OnePlus 12 profile (PowerInfer-2's phone, [PI2 §2.3]),
so the tests check the model's shape, not numbers copied into the test.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.hw.flash import FlashModel
from sim.profiles.registry import load_device

DEVICE = load_device("oneplus-12")
ST = DEVICE.storage
BIG, LITTLE = DEVICE.cpu.cluster("big"), DEVICE.cpu.cluster("little")
CORES = st.sampled_from(DEVICE.cpu.clusters)
BLOCKS = st.sampled_from([4096, 8192, 16384, 65536, 131072, 524288])


def flash() -> FlashModel:
    return FlashModel(DEVICE)


@settings(max_examples=40, deadline=None)
@given(block=BLOCKS, core=CORES, counts=st.lists(st.integers(1, 100_000), min_size=2, max_size=2, unique=True),
       sequential=st.booleans())
def test_service_time_grows_with_request_count(block, core, counts, sequential):
    few, many = sorted(counts)
    f = flash()
    t_few = f.batch_time_s(few, block, core, sequential=sequential)
    t_many = f.batch_time_s(many, block, core, sequential=sequential)
    assert t_many > t_few > f.latency_s
    # Beyond the fixed latency, time is linear in the bytes moved.
    assert (t_many - f.latency_s) / (t_few - f.latency_s) == pytest.approx(many / few, rel=1e-9)
    assert f.batch_time_s(0, block, core) == 0.0


@pytest.mark.parametrize("curve", ["seq_read", "rand_read"])
def test_measured_points_are_reproduced_and_larger_requests_are_faster(curve):
    f = flash()
    points = getattr(ST, curve)
    sequential = curve == "seq_read"
    for p in points:
        assert f.device_gbps(p.block, sequential) == pytest.approx(p.gbps)
    blocks = [4096 * 2**k for k in range(12) if points[0].block <= 4096 * 2**k <= points[-1].block]
    rates = [f.device_gbps(b, sequential) for b in blocks]
    assert all(b >= a for a, b in itertools.pairwise(rates))
    assert rates[-1] > rates[0]
    # Throughput a big batch really achieves follows the curve (latency amortised away).
    achieved = [100_000 * b / f.batch_time_s(100_000, b, BIG, sequential=sequential) / 1e9 for b in blocks]
    assert all(b > a for a, b in itertools.pairwise(achieved))
    assert not f.extrapolated


def test_interpolation_is_log_log_between_points():
    f = flash()
    lo, hi = ST.rand_read[0], ST.rand_read[1]
    mid = int(math.sqrt(lo.block * hi.block))
    assert f.device_gbps(mid) == pytest.approx(math.sqrt(lo.gbps * hi.gbps), rel=1e-3)


def test_outside_the_measured_range_clamps_and_warns():
    f = flash()
    huge = ST.rand_read[-1].block * 8
    assert f.device_gbps(huge) == pytest.approx(ST.rand_read[-1].gbps)
    assert any("outside measured" in w for w in f.extrapolated)


def test_range_effect_slows_random_reads_over_large_spans_only():
    f = flash()
    spans = [p.span for p in ST.range_effect]
    assert len(spans) >= 2, "the OnePlus 12 profile records PI2's 128 MB / 512 MB figures"
    near = f.device_gbps(4096, span_bytes=spans[0])
    far = f.device_gbps(4096, span_bytes=spans[-1])
    assert near == pytest.approx(ST.rand_read[0].gbps * ST.range_effect[0].factor)
    assert far == pytest.approx(ST.rand_read[0].gbps * ST.range_effect[-1].factor)
    assert far < near
    between = f.device_gbps(4096, span_bytes=int(math.sqrt(spans[0] * spans[-1])))
    assert far <= between <= near
    # Sequential reads do not care how far apart requests land.
    assert f.device_gbps(4096, sequential=True, span_bytes=spans[-1]) == f.device_gbps(4096, sequential=True)


def test_issuing_core_limits_small_reads():
    """[PI2 §2.3]: 4 KB random reads reach 1076 MB/s from the big core, 762 from a little one."""
    f = flash()
    assert LITTLE.io_4k_gbps < BIG.io_4k_gbps
    little = f.throughput_gbps(4096, LITTLE)
    big = f.throughput_gbps(4096, BIG)
    assert little == pytest.approx(min(f.device_gbps(4096), LITTLE.io_4k_gbps))
    assert big == pytest.approx(min(f.device_gbps(4096), BIG.io_4k_gbps))
    assert little < big
    assert f.batch_time_s(1000, 4096, LITTLE) > f.batch_time_s(1000, 4096, BIG)
    # The driver cost is per request: with large blocks the core is no longer the limit.
    assert f.throughput_gbps(524288, LITTLE) == pytest.approx(f.device_gbps(524288))


@settings(max_examples=30, deadline=None)
@given(block=BLOCKS, core=CORES, issuers=st.integers(1, 64), sequential=st.booleans())
def test_multi_issuer_penalty_is_bounded_by_the_profile(block, core, issuers, sequential):
    f = flash()
    alone = f.throughput_gbps(block, core, sequential=sequential)
    shared = f.throughput_gbps(block, core, sequential=sequential, n_issuers=issuers)
    more = f.throughput_gbps(block, core, sequential=sequential, n_issuers=issuers + 1)
    assert shared <= alone
    assert shared >= alone * (1 - ST.multi_issuer_penalty) - 1e-12
    assert more <= shared
    if issuers == 1:
        assert shared == alone


def test_multi_issuer_penalty_approaches_its_bound():
    f = flash()
    alone = f.throughput_gbps(65536, BIG)
    assert f.throughput_gbps(65536, BIG, n_issuers=10_000) == pytest.approx(alone * (1 - ST.multi_issuer_penalty),
                                                                             rel=1e-3)


@settings(max_examples=40, deadline=None)
@given(block=BLOCKS, depth=st.integers(1, 1024), sequential=st.booleans())
def test_a_shallow_queue_caps_throughput_by_littles_law(block, depth, sequential):
    """At most ``queue_depth`` reads are in flight, each for a latency plus its transfer."""
    f = FlashModel(DEVICE.model_copy(update={"storage": ST.model_copy(update={"queue_depth": depth})}))
    device = f.device_gbps(block, sequential)
    little = depth * block / (f.latency_s + block / (device * 1e9)) / 1e9
    got = f.throughput_gbps(block, BIG, sequential=sequential)
    assert got == pytest.approx(min(device, f.issuer_gbps(block, BIG), little), rel=1e-12)
    assert got <= little * (1 + 1e-12)


def test_queue_depth_one_makes_a_small_random_read_latency_bound_and_32_does_not():
    shallow = FlashModel(DEVICE.model_copy(update={"storage": ST.model_copy(update={"queue_depth": 1})}))
    qd1 = shallow.throughput_gbps(4096, BIG)
    assert qd1 == pytest.approx(4096 / (ST.read_latency_us * 1e-6 + 4096 / (flash().device_gbps(4096) * 1e9)) / 1e9)
    assert qd1 < 0.1 * flash().throughput_gbps(4096, BIG)  # tens of MB/s against the curve's ~1 GB/s
    assert ST.queue_depth == 32 and flash().throughput_gbps(4096, BIG) == pytest.approx(
        min(flash().device_gbps(4096), flash().issuer_gbps(4096, BIG)))  # the bundled depth never binds


@settings(max_examples=40, deadline=None)
@given(issuers=st.integers(1, 64), queues=st.integers(1, 63))
def test_more_command_queues_never_cost_throughput(issuers, queues):
    """Only issuers sharing a queue contend ([PI2 §2.3] measures UFS's single queue)."""
    def model(q: int) -> FlashModel:
        return FlashModel(DEVICE.model_copy(update={"storage": ST.model_copy(update={"command_queues": q})}))

    fewer, more = model(queues).contention(issuers), model(queues + 1).contention(issuers)
    assert more >= fewer
    assert model(issuers).contention(issuers) == 1.0  # a queue each: no contention
    single = model(1).contention(issuers)
    assert single == pytest.approx(1.0 - ST.multi_issuer_penalty * (1.0 - 1.0 / issuers), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(block=BLOCKS, core=CORES, n=st.integers(1, 100_000), sequential=st.booleans(),
       span=st.sampled_from([None, 128 << 20, 4 << 30]), issuers=st.integers(1, 4))
def test_a_back_to_back_batch_costs_its_transfer_without_the_latency(block, core, n, sequential, span, issuers):
    """Queued behind another batch, its commands wait in the command queue, so only the
    latency goes: never dearer than on an idle device, and no cheaper than its bytes."""
    f = flash()
    kw = dict(sequential=sequential, span_bytes=span, n_issuers=issuers)
    idle = f.batch_time_s(n, block, core, **kw)
    queued = f.batch_time_s(n, block, core, back_to_back=True, **kw)
    assert queued <= idle
    assert idle - queued == pytest.approx(f.latency_s, rel=1e-6, abs=1e-15)
    assert queued == pytest.approx(n * block / (f.throughput_gbps(block, core, **kw) * 1e9), rel=1e-12)
