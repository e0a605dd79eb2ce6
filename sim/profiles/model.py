"""Model profiles: the dimensions that decide bytes, FLOPs and sparsity.

Only architecture facts live here (from each model's published config), plus the
published activation sparsity with its source. Parameter counts are derived, and a test
checks them against the published totals so a typo in a dimension cannot go unnoticed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.bundled import bundled_dir
from sim.profiles.formats import NeuronBundle, WeightsDtype, get_format
from sim.profiles.schema import Strict, documentary

Activation = Literal["relu", "relu2", "drelu", "fatrelu", "silu", "gelu"]


class MoeSpec(Strict):
    n_experts: int = Field(ge=1, le=1024)
    top_k: int = Field(ge=1, le=64)


class SparsitySpec(Strict):
    """Published share of FFN neurons active per token (per expert for MoE)."""

    mean_active_fraction: float = Field(gt=0, le=1)
    # one fraction per layer when published, each in (0, 1] like the mean
    per_layer: list[Annotated[float, Field(gt=0, le=1)]] | None = None
    source: str = documentary("a citation", min_length=3)


class PredictorSpec(Strict):
    """Shape of the activation predictor: a low-rank MLP hidden -> rank -> ffn_dim.

    One predictor per layer (and per expert for MoE). Its bytes are held in DRAM and its
    FLOPs are charged per token, so the shape must be documented, not a size constant.
    """

    rank: int = Field(ge=1, le=65536)
    dtype: Literal["fp32", "fp16", "int8"] = "fp16"
    per_expert: bool = True
    source: str = documentary("a citation", min_length=3)

    @property
    def bytes_per_weight(self) -> int:
        return {"fp32": 4, "fp16": 2, "int8": 1}[self.dtype]


class ModelProfile(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = documentary("a label", "")
    family: Literal["llama", "mistral", "mixtral", "qwen2", "opt", "falcon", "persimmon", "phi",
                    "bert"] = documentary("a label (the dimensions are what the simulation reads)")
    n_layers: int = Field(ge=1, le=1000)
    hidden: int = Field(ge=8, le=1_000_000)
    ffn_dim: int = Field(ge=1, le=10_000_000)  # neurons per expert
    n_heads: int = Field(ge=1)
    n_kv_heads: int = Field(ge=1)
    head_dim: int | None = Field(default=None, ge=1)
    vocab: int = Field(ge=1)
    max_context: int = Field(ge=1)
    ffn_gated: bool  # gate/up/down (SwiGLU-style) versus up/down
    activation: Activation = documentary("read only when recording a trace from weights (sim trace "
                                         "record) and to choose the preset a model without one derives "
                                         "its locality from (sim trace presets); a run replays the trace")
    tied_embeddings: bool = False
    moe: MoeSpec | None = None
    sparsity: SparsitySpec = documentary("the published figure, kept for reference (the simulated "
                                         "activations come from the trace: --preset or --trace; a model "
                                         "without a bundled preset derives its preset's density from it, "
                                         "see sim trace presets; sim trace synth makes one at another "
                                         "density)")
    predictor: PredictorSpec
    default_dtype: WeightsDtype = "int4"
    # total parameters, billions, from the model card (the dimensions give the simulated sizes)
    published_params_b: float = documentary("the model card's figure, kept for reference (the dimensions "
                                     "give the simulated sizes)", gt=0)
    source: str = documentary("a citation", min_length=3)

    @model_validator(mode="after")
    def _consistent(self) -> ModelProfile:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim is None and self.hidden % self.n_heads:
            raise ValueError(f"hidden {self.hidden} must be a multiple of n_heads {self.n_heads} "
                             "(or give head_dim, as Falcon-7B's 4544 / 71 needs)")
        if self.moe and self.moe.top_k > self.moe.n_experts:
            raise ValueError(f"moe.top_k {self.moe.top_k} must not exceed moe.n_experts {self.moe.n_experts}")
        if self.sparsity.per_layer is not None and len(self.sparsity.per_layer) != self.n_layers:
            raise ValueError(f"sparsity.per_layer must have n_layers={self.n_layers} entries, "
                             f"got {len(self.sparsity.per_layer)}")
        return self

    # -- derived dimensions ----------------------------------------------------------
    @property
    def n_experts(self) -> int:
        return self.moe.n_experts if self.moe else 1

    @property
    def top_k(self) -> int:
        return self.moe.top_k if self.moe else 1

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.n_heads

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.ffn_gated else 2

    @property
    def ffn_neurons_total(self) -> int:
        return self.n_layers * self.n_experts * self.ffn_dim

    @property
    def ffn_params(self) -> int:
        return self.ffn_neurons_total * self.ffn_matrices * self.hidden

    @property
    def attention_params_per_layer(self) -> int:
        q_out = self.n_heads * self.head_size
        kv_out = self.n_kv_heads * self.head_size
        return self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden

    @property
    def attention_params(self) -> int:
        return self.n_layers * self.attention_params_per_layer

    @property
    def router_params(self) -> int:
        return self.n_layers * self.hidden * self.n_experts if self.moe else 0

    @property
    def norm_params(self) -> int:
        return (2 * self.n_layers + 1) * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def total_params(self) -> int:
        return (self.ffn_params + self.attention_params + self.router_params + self.norm_params
                + self.embedding_params)

    @property
    def kv_bytes_per_token(self) -> int:
        """fp16 keys and values for one token across all layers."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_size * 2

    @property
    def predictor_params(self) -> int:
        per = self.predictor.rank * (self.hidden + self.ffn_dim)
        count = self.n_layers * (self.n_experts if self.predictor.per_expert else 1)
        return per * count

    @property
    def predictor_bytes(self) -> int:
        return self.predictor_params * self.predictor.bytes_per_weight

    def bundle(self, dtype: str | None = None, alignment_bytes: int = 4096) -> NeuronBundle:
        fmt = get_format(dtype or self.default_dtype, hidden=self.hidden)
        return NeuronBundle(self.ffn_matrices, self.hidden, fmt, alignment_bytes)


BUNDLED_DIR = bundled_dir("model_profiles")
