"""Neuron-bundle byte sizes against the figures the papers publish.

[PI2 §4.4] = PowerInfer-2, Xue et al., arXiv 2406.06282 v3, §4.4 (flash layout): an INT4
bundle (gate, up and down rows of one neuron, hidden 4096) is ~7.5 KB, padded to 8 KB and
read as two 4 KB reads (Gate first, Up/Down only if the Gate output is non-zero); an FP16
bundle is one 24 KB read.
[FLASH §3.2] = LLM in a Flash, arXiv 2312.11514 v3: bundling the i-th up column with the
i-th down row doubles the read size.
"""

from __future__ import annotations

from sim.profiles.formats import NeuronBundle, get_format
from sim.profiles.registry import load_device, load_model

KiB = 1024


def test_int4_gated_bundle_hidden_4096():
    bundle = NeuronBundle(matrices=3, hidden=4096, fmt=get_format("int4", hidden=4096))
    assert bundle.packed_bytes == 7680 == 7.5 * KiB  # [PI2 §4.4] "~7.5 KB"
    assert bundle.flash_bytes == 8 * KiB  # [PI2 §4.4] padded to 8 KB
    # [PI2 §4.4] two 4 KB reads: Gate first, then Up/Down
    assert (bundle.gate_flash_bytes, bundle.up_down_flash_bytes) == (4 * KiB, 4 * KiB)
    # In DRAM only the 4-bit values: scales stay in the resident scale region [PI2 §7.3]
    assert bundle.dram_bytes == 3 * 4096 // 2


def test_fp16_gated_bundle_hidden_4096():
    bundle = NeuronBundle(matrices=3, hidden=4096, fmt=get_format("fp16"))
    assert bundle.packed_bytes == bundle.flash_bytes == 24 * KiB  # [PI2 §4.4] one 24 KB read
    assert bundle.dram_bytes == 24 * KiB


def test_model_profiles_produce_the_published_bundles():
    for name in ("turbosparse-mistral-7b", "turbosparse-mixtral-47b", "bamboo-7b"):
        model = load_model(name)
        assert model.bundle("int4").flash_bytes == 8 * KiB, name
        assert model.bundle("fp16").flash_bytes == 24 * KiB, name


def test_opt_bundle_matches_the_flash_bundled_read():
    """OPT-6.7B fp16 up column + down row = 2 x 4096 x 2 B = 16 KiB, twice the unbundled
    8 KiB read [FLASH §3.2]; the M1 Max profile's random-read curve has both points."""
    bundle = load_model("opt-6.7b").bundle("fp16")
    assert bundle.matrices == 2 and bundle.flash_bytes == 16 * KiB
    blocks = {p.block: p.gbps for p in load_device("macbook-pro-m1-max").storage.rand_read}
    assert blocks[8 * KiB] == 1.25 and blocks[16 * KiB] == 2.25  # [FLASH] 1.25 / 2.25 GB/s
