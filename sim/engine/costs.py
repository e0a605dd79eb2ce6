"""Bytes and operations of the dense parts of a transformer step, per layer.

Shared by every strategy and by the analytic model so that the DES and the cost model
charge exactly the same work; only how the work is scheduled differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from sim.hw.processors import DEQUANT_OPS_PER_WEIGHT, accel_format
from sim.profiles.device import Accelerator
from sim.profiles.formats import WeightFormat, get_format
from sim.profiles.model import ModelProfile


@dataclass(frozen=True)
class Work:
    weight_bytes: float
    ops: float

    def __add__(self, other: Work) -> Work:
        return Work(self.weight_bytes + other.weight_bytes, self.ops + other.ops)

    def scaled(self, k: float) -> Work:
        return Work(self.weight_bytes * k, self.ops * k)


@dataclass(frozen=True)
class ModelCosts:
    """Per-layer costs of one model in one weight format."""

    model: ModelProfile
    dtype: str

    @cached_property
    def fmt(self) -> WeightFormat:
        return get_format(self.dtype, hidden=self.model.hidden)

    def attention(self, context_tokens: int, batch: int = 1) -> Work:
        """QKV/O projections plus reading the KV cache for ``context_tokens`` positions."""
        m = self.model
        params = m.attention_params_per_layer
        kv_bytes = context_tokens * 2 * m.n_kv_heads * m.head_size * 2  # fp16 K and V
        score_ops = 4 * context_tokens * m.n_heads * m.head_size * batch
        return Work(self.fmt.packed_bytes(params) + kv_bytes, 2 * params * batch + score_ops)

    def router(self, batch: int = 1) -> Work:
        m = self.model
        params = m.hidden * m.n_experts if m.moe else 0
        return Work(params * 2, 2 * params * batch)

    def predictor(self, batch: int = 1) -> Work:
        """The low-rank predictors of the experts the router chose (or the layer's one)."""
        m = self.model
        per = m.predictor.rank * (m.hidden + m.ffn_dim)
        count = m.top_k if m.predictor.per_expert else 1
        return Work(per * count * m.predictor.bytes_per_weight, 2 * per * count * batch)

    def neurons(self, n: float, matrices: float | None = None, batch: int = 1) -> Work:
        """``n`` neurons' worth of FFN rows (``matrices`` of gate/up/down, default all)."""
        m = self.model
        mats = m.ffn_matrices if matrices is None else matrices
        weights = n * mats * m.hidden
        return Work(self.fmt.packed_bytes(weights), 2 * weights * batch)

    def lm_head(self, batch: int = 1) -> Work:
        m = self.model
        params = m.vocab * m.hidden
        return Work(self.fmt.packed_bytes(params), 2 * params * batch)

    def dense_ffn(self, batch: int = 1) -> Work:
        """All neurons of the experts one token uses (dense inference)."""
        return self.neurons(self.model.top_k * self.model.ffn_dim, batch=batch)

    def layer_weights(self) -> int:
        """How many weights one layer has (attention and every expert's FFN)."""
        m = self.model
        return m.attention_params_per_layer + m.n_experts * m.ffn_dim * m.ffn_matrices * m.hidden

    def layer_weight_bytes(self) -> float:
        """Every weight of one layer (all experts): what a dense prefill streams."""
        return self.fmt.packed_bytes(self.layer_weights())

    def on_unit(self, acc: Accelerator | None, work: Work, n_weights: float) -> tuple[Work | None, Work, str]:
        """``work`` (over ``n_weights`` weights in this format) as accelerator ``acc`` runs it:
        the CPU's conversion first (None when the unit computes on this format), the unit's
        work reading the weights in the format it takes, and that format. ``acc`` None: the
        CPU, which takes every format."""
        to = accel_format(acc, self.dtype) if acc is not None else None
        if to is None:
            return None, work, self.dtype
        converted = get_format(to, hidden=self.model.hidden).packed_bytes(n_weights)
        unit_work = Work(work.weight_bytes - self.fmt.packed_bytes(n_weights) + converted, work.ops)
        return self.convert(n_weights, to), unit_work, to

    def dense_layer_weights(self) -> int:
        """How many weights a dense token step of one layer uses (attention, chosen experts)."""
        m = self.model
        return m.attention_params_per_layer + m.top_k * m.ffn_dim * m.ffn_matrices * m.hidden

    def convert(self, n_weights: float, to_dtype: str) -> Work:
        """Converting ``n_weights`` weights to ``to_dtype`` on the CPU (for an accelerator that
        cannot compute on this format): read them packed, write them converted."""
        out = get_format(to_dtype, hidden=self.model.hidden).packed_bytes(n_weights)
        return Work(self.fmt.packed_bytes(n_weights) + out, DEQUANT_OPS_PER_WEIGHT * n_weights)


def affine_in_count(time_of: Callable[[float], float], ref: float = 2.0**20) -> tuple[float, float]:
    """(intercept, slope) of a time that is affine in a count ``n > 0``: a roofline at a fixed
    arithmetic intensity plus a fixed latency or launch overhead (a batch of flash reads, an
    accelerator call). Two evaluations give both, so a caller can apply the device models to
    many counts as array operations (the analytic mode's re-evaluation)."""
    one, many = time_of(1.0), time_of(ref + 1.0)
    slope = (many - one) / ref
    return one - slope, slope
