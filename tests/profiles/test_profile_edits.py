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
])
def test_bad_edits_are_one_line_errors_naming_the_edit(edits, field, text):
    with pytest.raises(sim.SimError) as info:
        sim.edit_device("oneplus-12", edits)
    assert info.value.field == field and text in str(info.value) and "\n" not in str(info.value)
