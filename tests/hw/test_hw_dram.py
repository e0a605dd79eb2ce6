"""Shared DRAM bandwidth (sim.hw.dram): agents alone, together, and CPU threads among them.

[PI2 §2.3] measured on the OnePlus 12: CPU alone 43.9 GB/s, NPU alone 56, both 59.6; the
bundled profile carries those numbers and the tests read them from it.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.hw.dram import DramModel, water_fill
from sim.profiles.device import BUNDLED_DIR, DeviceProfile
from sim.profiles.registry import load_device

DEVICE = load_device("oneplus-12")
CPU_NPU = frozenset({"cpu", "npu"})


def test_cpu_alone_gets_its_measured_bandwidth():
    dram = DramModel(DEVICE)
    assert dram.agent_gbps("cpu", frozenset({"cpu"})) == DEVICE.cpu.mem_gbps
    assert dram.agent_gbps("npu", frozenset({"npu"})) == DEVICE.npu.mem_gbps


def test_cpu_and_npu_share_the_combined_figure():
    dram = DramModel(DEVICE)
    cpu, npu = dram.agent_gbps("cpu", CPU_NPU), dram.agent_gbps("npu", CPU_NPU)
    assert cpu + npu == pytest.approx(DEVICE.dram.combined_gbps)
    assert cpu < DEVICE.cpu.mem_gbps and npu < DEVICE.npu.mem_gbps
    assert cpu / npu == pytest.approx(DEVICE.cpu.mem_gbps / DEVICE.npu.mem_gbps)
    assert cpu + npu <= dram.peak_gbps


def test_agents_never_get_more_than_alone():
    data = yaml.safe_load((BUNDLED_DIR / "oneplus-12.yaml").read_text())
    roomy = copy.deepcopy(data)
    roomy["dram"]["combined_gbps"] = roomy["dram"]["peak_gbps"]
    roomy["cpu"]["mem_gbps"] = roomy["npu"]["mem_gbps"] = 30.0
    dram = DramModel(DeviceProfile.model_validate(roomy))
    # combined (76.8) exceeds the sum of solo figures (60): each keeps its own.
    assert dram.agent_gbps("cpu", CPU_NPU) == 30.0
    assert dram.agent_gbps("npu", CPU_NPU) == 30.0


def test_threads_split_the_cpu_figure_capped_by_their_core():
    dram = DramModel(DEVICE)
    alone = frozenset({"cpu"})
    assert dram.cpu_thread_gbps(18.0, 1, alone) == 18.0
    assert dram.cpu_thread_gbps(18.0, 6, alone) == pytest.approx(DEVICE.cpu.mem_gbps / 6)
    assert dram.cpu_thread_gbps(18.0, 6, CPU_NPU) == pytest.approx(dram.agent_gbps("cpu", CPU_NPU) / 6)


def test_thread_shares_equal_split_when_demands_are_equal():
    dram = DramModel(DEVICE)
    for n in (1, 3, 8):
        shares = dram.cpu_thread_shares([20.0] * n, frozenset({"cpu"}))
        assert shares == pytest.approx([dram.cpu_thread_gbps(20.0, n, frozenset({"cpu"}))] * n)


def test_compute_bound_threads_leave_bandwidth_to_the_others():
    dram = DramModel(DEVICE)
    total = DEVICE.cpu.mem_gbps
    shares = dram.cpu_thread_shares([2.0, 2.0, 40.0], frozenset({"cpu"}))
    assert shares[:2] == [2.0, 2.0]
    assert shares[2] == pytest.approx(total - 4.0)


@settings(max_examples=60, deadline=None)
@given(total=st.floats(0.1, 200.0), demands=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=12))
def test_water_fill_is_max_min_fair(total, demands):
    shares = water_fill(total, demands)
    assert len(shares) == len(demands)
    assert sum(shares) <= total * (1 + 1e-9)
    assert all(0.0 <= s <= d + 1e-12 for s, d in zip(shares, demands, strict=True))
    if sum(demands) <= total:
        assert shares == pytest.approx(demands)
    else:
        assert sum(shares) == pytest.approx(total)
        # Whoever is held below its demand gets the largest share: nobody could gain
        # without taking from someone who has no more than it.
        level = max(shares)
        for s, d in zip(shares, demands, strict=True):
            if s < d - 1e-9:
                assert s == pytest.approx(level)
