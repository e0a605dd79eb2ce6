"""sim/engine/bottleneck.py: what binds a token, per phase, named down to the flash's own limits.

The issue's case: TurboSparse-Mixtral-47B at 7 GB streams nearly every neuron from flash;
quadrupling the UFS curves changes nothing because the issuing core's 4 KiB request rate
binds, not the device. Runs are 6 decode tokens (the figures are per token).
"""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.engine.bottleneck import flash_limit
from sim.profiles.registry import load_device

FAST_UFS = "device.storage.rand_read.*.gbps:scale=4"


def _bottleneck(capsys, *sets: str) -> dict:
    args = ["run", "--memory-budget", "7GB", "--decode-tokens", "6", "--warmup-tokens", "4", "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    return out["bottleneck"]


def test_at_7gb_with_4x_ufs_the_io_cores_issue_rate_binds_and_then_the_queue_depth(capsys):
    fast = _bottleneck(capsys, FAST_UFS)
    assert fast["token"]["resource"].startswith("I/O core issue rate")
    assert fast["phases"]["ffn"]["resource"].startswith("I/O core issue rate")
    assert fast["token"]["shares"][fast["token"]["resource"]] > 0.8
    # another issuing core on UFS's single command queue: the batches still queue one behind another
    more_io = _bottleneck(capsys, FAST_UFS, "io_cores=[big,mid-hi]")
    assert more_io["token"]["resource"].startswith("I/O core issue rate")
    # issuing cores 4x faster: the issue rate no longer binds; the next limit is the 32-entry queue
    # (Little's law: 32 x 4 KiB in flight for 80 us each is ~1.6 GB/s, under the 4x curve's ~4 GB/s)
    faster_io = _bottleneck(capsys, FAST_UFS, "device.cpu.clusters.*.io_4k_gbps:scale=4")
    assert faster_io["token"]["resource"] == "command queue depth"
    assert faster_io["phases"]["attention"]["resource"] in ("CPU compute", "DRAM bandwidth")


def _run(capsys, *sets: str) -> tuple[float, str]:
    args = ["run", "--memory-budget", "7GB", "--decode-tokens", "6", "--warmup-tokens", "4", "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    return out["decode_tokens_per_s"], out["bottleneck"]["token"]["resource"]


def test_relieving_what_is_named_is_what_speeds_the_token_up(capsys):
    """The name is the limit that binds, not merely the busiest unit: relieving it, four times over,
    speeds the 7 GB token up, and relieving the flash curves while the issue rate binds does little."""
    ladder = [(), (FAST_UFS,), (FAST_UFS, "device.cpu.clusters.*.io_4k_gbps:scale=4"),
              (FAST_UFS, "device.cpu.clusters.*.io_4k_gbps:scale=4", "device.storage.queue_depth:scale=4")]
    runs = [_run(capsys, *sets) for sets in ladder]
    names = [name for _, name in runs]
    assert names[1].startswith("I/O core issue rate")
    assert names[2:] == ["command queue depth", "flash device (4 KiB reads)"]
    speed = [tps for tps, _ in runs]
    assert speed[1] < 1.1 * speed[0]  # 4x flash: the issuing core caps the reads
    assert speed[2] > 1.3 * speed[1] and speed[3] > 1.3 * speed[2]  # each named limit relieved pays


def test_shares_of_a_token_add_up_to_one(capsys):
    b = _bottleneck(capsys)
    assert sum(b["token"]["shares"].values()) == pytest.approx(1.0)
    for phase in b["phases"].values():
        assert sum(phase["shares"].values()) == pytest.approx(1.0)


def test_flash_limit_names_the_lowest_of_device_issuer_and_queue():
    dev = load_device("oneplus-12")
    assert flash_limit(dev, 4096, ["mid-hi"]) == "flash device (4 KiB reads)"  # 1.0 GB/s device vs 1.008 issuer
    assert flash_limit(dev, 4096, ["little"]) == "I/O core issue rate (little)"  # 0.762 GB/s
    assert flash_limit(dev, 512 * 1024, ["big"]).startswith("flash device")  # big reads: the curve's 3.5 GB/s
