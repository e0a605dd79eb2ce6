"""sim/engine/busiest.py: the busiest resource of a decode, from the run's utilisation table."""

from __future__ import annotations

import engine_helpers as h
import pytest

from sim.engine.busiest import busiest_resource
from sim.engine.simulation import simulate


@pytest.mark.parametrize(("utilisation", "expected"), [
    # the compute threads are one pool: their mean, not their busiest thread
    ({"cpu:big0": 0.9, "cpu:mid0": 0.1, "io0:mid": 0.55, "storage": 0.6, "npu": 0.1}, ("flash", 0.6)),
    ({"cpu:big0": 0.9, "cpu:mid-hi1": 0.7, "io0:mid-hi": 0.3, "storage": 0.4}, ("cpu", 0.8)),
    ({"cpu:x4-0": 0.2, "npu": 0.6, "storage": 0.3}, ("npu", 0.6)),
    ({}, ("-", 0.0)),
])
def test_the_busiest_resource_groups_threads_into_their_resource(utilisation, expected):
    name, busy = busiest_resource({"utilisation": utilisation})
    assert (name, pytest.approx(busy)) == expected


def test_a_flash_bound_run_names_flash_and_a_resident_one_the_cpu():
    m = h.model()
    run = {"trace": h.trace(m, 14), "decode_tokens": 6, "prompt_tokens": 8, "warmup_tokens": 4}
    streaming = simulate(h.device(), m, "powerinfer2", offload=0.95, knobs={"pipeline": False}, **run)
    resident = simulate(h.device(), m, "powerinfer2", offload=0.0, knobs={"xpu": False}, **run)
    assert busiest_resource(streaming.summary)[0] == "flash"
    assert busiest_resource(resident.summary)[0] == "cpu"
