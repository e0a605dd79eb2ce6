"""sim.edit_device / sim.edit_model: the --set and sweep-axis edits, from Python."""

from __future__ import annotations

import pytest

import sim
from sim.profiles.registry import load_device


def test_an_edit_is_the_profile_a_file_with_that_edit_gives():
    edited = sim.edit_device("oneplus-12", {"cpu.clusters.big.cores": 3, "storage.rand_read.*.gbps:scale": 0.5})
    by_hand = load_device("oneplus-12").model_dump(mode="json")
    by_hand["cpu"]["clusters"][0]["cores"] = 3
    for point in by_hand["storage"]["rand_read"]:
        point["gbps"] *= 0.5
    assert edited.model_dump(mode="json") == by_hand
    assert load_device("oneplus-12").cpu.cluster("big").cores == 1  # the bundled profile is untouched


def test_edited_profiles_run_and_change_the_prediction():
    base = sim.simulate("oneplus-12", "turbosparse-mistral-7b", offload=0.5, decode_tokens=4, warmup_tokens=2,
                        profile_tokens=4, mode="analytic").summary["decode_tokens_per_s"]
    slow = sim.edit_device("oneplus-12", {"storage.rand_read.*.gbps:scale": 0.1, "storage.seq_read.*.gbps:scale": 0.1})
    slower = sim.simulate(slow, "turbosparse-mistral-7b", offload=0.5, decode_tokens=4, warmup_tokens=2,
                          profile_tokens=4, mode="analytic").summary["decode_tokens_per_s"]
    assert slower < base
    assert sim.edit_model("turbosparse-mistral-7b", {"predictor.rank": 512}).predictor.rank == 512


@pytest.mark.parametrize(("edits", "field", "text"), [
    ({"cpu.clusters.big.cores": 0}, "edits['cpu.clusters.big.cores']", ">= 1"),
    ({"storage.nope": 1}, "edits['storage.nope']", "no field 'nope'"),
    ({"soc": "x"}, "edits['soc']", "not read by the simulation"),
    ({"cpu.clusters.big.cores": 2, "cpu.clusters.0.cores": 3}, "edits['cpu.clusters.0.cores']", "one edit per field"),
    ([("cpu.clusters.big.cores", 2)], "edits", "mapping of field paths"),
    ({"cpu.clusters.little.cores": 3, "cpu.clusters.-1.cores": 2}, "edits['cpu.clusters.-1.cores']",
     "one edit per field"),  # -1 is the last cluster: the same field
    ({"cpu.mem_gbps:scale": 10**400}, "edits['cpu.mem_gbps:scale']", "finite"),
    ({"dram.total_bytes": 10**400}, "edits['dram.total_bytes']", "too large"),
    ({"cpu.clusters.\u00b2.cores": 2}, "edits['cpu.clusters.\u00b2.cores']", "no entry named"),
    ({"storage.rand_read": (p for p in [1])}, "edits['storage.rand_read']", "cannot use a generator"),
    ({"device.cpu.clusters.big.cores": 2}, "edits['device.cpu.clusters.big.cores']", "without the device. prefix"),
    ({"cpu.mem_gbps": 100, "npu.mem_gbps": 30}, "edits['cpu.mem_gbps']", "exceeds dram.peak_gbps"),
])
def test_bad_edits_are_one_line_errors_naming_the_edit(edits, field, text):
    with pytest.raises(sim.SimError) as info:
        sim.edit_device("oneplus-12", edits)
    assert info.value.field == field and text in str(info.value) and "\n" not in str(info.value)


def test_numpy_scalars_are_numbers_in_edits():
    import numpy as np

    edited = sim.edit_device("oneplus-12", {"cpu.clusters.big.cores": np.int64(3),
                                           "storage.rand_read.*.gbps:scale": np.float32(0.5)})
    assert edited.cpu.cluster("big").cores == 3 and type(edited.cpu.cluster("big").cores) is int
    assert edited.storage.rand_read[0].gbps == pytest.approx(0.5 * load_device("oneplus-12").storage.rand_read[0].gbps)


def test_lowering_every_dram_bandwidth_together_is_possible():
    """The GPU's bandwidth is checked against DRAM's, so lowering all of them must be one edit."""
    half = {f"{part}:scale": 0.5 for part in ("dram.peak_gbps", "dram.combined_gbps", "cpu.mem_gbps",
                                              "npu.mem_gbps", "gpu.mem_gbps")}
    assert sim.edit_device("oneplus-12", half).dram.peak_gbps == pytest.approx(
        0.5 * load_device("oneplus-12").dram.peak_gbps)
