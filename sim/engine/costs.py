"""Bytes and operations of the dense parts of a transformer step, per layer.

Shared by every strategy and by the analytic model so that the DES and the cost model
charge exactly the same work; only how the work is scheduled differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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

    def layer_weight_bytes(self) -> float:
        """Every weight of one layer (all experts): what a dense prefill streams."""
        m = self.model
        return self.fmt.packed_bytes(m.attention_params_per_layer + m.n_experts * m.ffn_dim *
                                     m.ffn_matrices * m.hidden)
