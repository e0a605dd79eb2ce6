"""Weight formats and what they make a neuron bundle cost, in DRAM and on flash.

A neuron bundle is what sparse inference moves as a unit: the gate, up and down weights
of one FFN neuron (``hidden`` weights each; gate is absent in non-gated FFNs). Its size
follows from the format: quantised weights plus per-group scale (and minimum) values.

PowerInfer-2 [PI2 §4.4, §6.2] keeps the FFN quantisation scales resident in DRAM (the
"FFN quantization scales 2.7 GB" line of its 7 GB memory breakdown) while each flash
bundle is self-contained (INT4: ~7.5 KB padded to 8 KB). Here, accordingly, a cached
neuron costs only its quantised weights in DRAM, and the resident scale region holds one
scale per group for every FFN weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

WeightsDtype = Literal["fp32", "fp16", "int8", "int4"]


def check_dtype(value: str | None) -> str | None:
    """``value`` if it names a weights format (or is None: the model's default), else a ``--weights-dtype`` error."""
    from sim.checks import shown
    from sim.errors import SimError

    allowed = get_args(WeightsDtype)
    if value is not None and value not in allowed:
        raise SimError(f"must be one of {', '.join(allowed)}; got {shown(value)}", field="--weights-dtype")
    return value


@dataclass(frozen=True)
class WeightFormat:
    """How one weight matrix is stored."""

    name: str
    bits: int
    group_size: int | None  # weights per scale group; None: no scales (float formats)
    scale_bytes: int = 0  # per group
    min_bytes: int = 0  # per group (asymmetric quantisation); stored with the bundle on flash

    def weight_bytes(self, n_weights: int) -> float:
        """Bytes of the quantised values alone."""
        return n_weights * self.bits / 8

    def scale_bytes_for(self, n_weights: int) -> float:
        """Bytes of the per-group scales (the part PowerInfer-2 keeps resident)."""
        return 0.0 if self.group_size is None else n_weights / self.group_size * self.scale_bytes

    def packed_bytes(self, n_weights: int) -> float:
        """Self-contained bytes: values, scales and minimums (how dense weights are stored)."""
        if self.group_size is None:
            return self.weight_bytes(n_weights)
        groups = n_weights / self.group_size
        return self.weight_bytes(n_weights) + groups * (self.scale_bytes + self.min_bytes)

    @property
    def compute_bytes_per_weight(self) -> float:
        return self.packed_bytes(1_000_000) / 1_000_000


# Group size 32 with an fp16 scale and fp16 minimum is llama.cpp's Q4_1; it reproduces
# PowerInfer-2's "INT4 bundle ~7.5 KB" for hidden 4096: 3*4096*0.5 + 384*(2+2) = 7680 B.
FORMATS: dict[str, WeightFormat] = {
    "fp32": WeightFormat("fp32", 32, None),
    "fp16": WeightFormat("fp16", 16, None),
    # int8 with one fp16 scale per row of `hidden` weights (per-channel), set per model.
    "int8": WeightFormat("int8", 8, 4096, scale_bytes=2),
    "int4": WeightFormat("int4", 4, 32, scale_bytes=2, min_bytes=2),
}


def get_format(name: str, *, hidden: int | None = None) -> WeightFormat:
    """Look up a format; int8 is per-channel, so its group is the model's row length."""
    fmt = FORMATS[name]
    if name == "int8" and hidden is not None:
        fmt = WeightFormat("int8", 8, hidden, scale_bytes=2)
    return fmt


@dataclass(frozen=True)
class NeuronBundle:
    """Byte sizes of one neuron's gate/up/down weights in a given format."""

    matrices: int  # 3 for gated FFNs (gate, up, down), 2 for plain (up, down)
    hidden: int
    fmt: WeightFormat
    alignment_bytes: int = 4096  # flash page: reads are whole pages

    @property
    def weights(self) -> int:
        return self.matrices * self.hidden

    @property
    def dram_bytes(self) -> int:
        """What a cached neuron occupies in the neuron cache (scales live elsewhere)."""
        return math.ceil(self.fmt.weight_bytes(self.weights))

    @property
    def packed_bytes(self) -> int:
        """Self-contained bundle as stored on flash before padding."""
        return math.ceil(self.fmt.packed_bytes(self.weights))

    @property
    def flash_bytes(self) -> int:
        """Bytes read from flash for one neuron: the bundle padded to whole pages."""
        return _round_up(self.packed_bytes, self.alignment_bytes)

    @property
    def gate_flash_bytes(self) -> int:
        """First read of a gated bundle (PowerInfer-2 reads Gate first, Up/Down if needed).

        PI2 §4.4 reads an INT4 bundle as two 4 KB reads; in general the gate read is the
        page-rounded share of one matrix, and the up/down read the rest of the bundle.
        """
        if self.matrices < 3:
            return self.flash_bytes
        return min(self.row_flash_bytes, self.flash_bytes)

    @property
    def row_flash_bytes(self) -> int:
        """One matrix's row of the neuron read on its own: its share of the packed bundle,
        padded to whole pages (the request size when rows are stored matrix by matrix)."""
        return _round_up(math.ceil(self.packed_bytes / self.matrices), self.alignment_bytes)

    @property
    def up_down_flash_bytes(self) -> int:
        return self.flash_bytes - self.gate_flash_bytes if self.matrices >= 3 else 0


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
