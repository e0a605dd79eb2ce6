"""DRAM accounting: what must stay resident, and what the neuron cache gets.

PowerInfer-2 [PI2 §7, memory breakdown at 7 GB for TurboSparse-Mixtral-47B] sizes its
neuron cache as "whatever the memory budget leaves" once the fixed region (non-FFN
weights, KV cache), the predictors, the FFN quantisation scales and the runtime are
resident. Every line here is derived from the model's dimensions and weight format; the
only constant is the runtime's own footprint, which PI2 reports.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field

from sim.checks import check_bool, check_int
from sim.errors import SimError
from sim.profiles.device import DeviceProfile
from sim.profiles.formats import get_format
from sim.profiles.model import ModelProfile
from sim.units import SizeSpec, format_bytes, parse_size_or_percent

# [PI2 §7 memory breakdown]: "runtime 0.3 GB" for TurboSparse-Mixtral-47B at 7 GB.
DEFAULT_RUNTIME_BYTES = 300_000_000
# Assumed KV-cache context when none is given: a 64-token prompt plus generated tokens
# fits well within it, as in [PI2 §7.1]'s decode experiments.
DEFAULT_CONTEXT_TOKENS = 512
# The one rule of the CLI: the KV cache holds the run's prompt plus decoded tokens. `sim run`
# sizes it for its --prompt-tokens + --decode-tokens; `sim memory` by default for those
# defaults (so one budget shows one neuron cache in both), and both print the count.
RUN_PROMPT_TOKENS = 64
RUN_DECODE_TOKENS = 128
RUN_CONTEXT_TOKENS = RUN_PROMPT_TOKENS + RUN_DECODE_TOKENS


@dataclass(frozen=True)
class MemoryPlan:
    """The DRAM split for one model/format/device/budget; all sizes in bytes."""

    model: str
    device: str
    weights_dtype: str
    budget_bytes: int
    resident: dict[str, int]  # component -> bytes that never leave DRAM
    ffn_bytes: int  # all FFN neuron bundles (quantised values) if they were all in DRAM
    neuron_cache_bytes: int  # DRAM left for FFN neurons, capped at ffn_bytes
    unused_bytes: int  # budget beyond what the model can use
    neuron_dram_bytes: int  # one cached neuron bundle
    neuron_flash_bytes: int  # one neuron bundle as read from flash (page-padded)
    context_tokens: int
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def resident_bytes(self) -> int:
        return sum(self.resident.values())

    @property
    def ffn_resident_fraction(self) -> float:
        return self.neuron_cache_bytes / self.ffn_bytes if self.ffn_bytes else 1.0

    @property
    def offload_fraction(self) -> float:
        return 1.0 - self.ffn_resident_fraction

    @property
    def cache_neurons(self) -> int:
        return self.neuron_cache_bytes // self.neuron_dram_bytes

    def rows(self) -> list[dict[str, object]]:
        """Tidy rows (component, bytes, share of budget) for tables and DataFrames."""
        out = [{"component": k, "bytes": v} for k, v in self.resident.items()]
        out.append({"component": "neuron_cache", "bytes": self.neuron_cache_bytes})
        if self.unused_bytes:
            out.append({"component": "unused", "bytes": self.unused_bytes})
        for row in out:
            row["share_of_budget"] = row["bytes"] / self.budget_bytes if self.budget_bytes else 0.0
        return out

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.update(resident_bytes=self.resident_bytes, ffn_resident_fraction=self.ffn_resident_fraction,
                    offload_fraction=self.offload_fraction, cache_neurons=self.cache_neurons)
        return data


def resident_components(model: ModelProfile, dtype: str, context_tokens: int, *, predictor: bool = True,
                        split_scales: bool = True, runtime_bytes: int = DEFAULT_RUNTIME_BYTES) -> dict[str, int]:
    """Bytes of everything that stays in DRAM besides cached FFN neurons."""
    fmt = get_format(dtype, hidden=model.hidden)
    comps = {
        "embeddings": int(fmt.packed_bytes(model.embedding_params)),
        "attention": int(fmt.packed_bytes(model.attention_params)),
        "norms_router": int((model.norm_params + model.router_params) * 2),  # fp16
        "kv_cache": model.kv_bytes_per_token * context_tokens,
    }
    if predictor:
        comps["predictors"] = model.predictor_bytes
    if split_scales:
        comps["ffn_scales"] = int(fmt.scale_bytes_for(model.ffn_params))
    comps["runtime"] = runtime_bytes
    return comps


def model_weight_bytes(model: ModelProfile, dtype: str) -> int:
    """All weights in the given format, self-contained (what a `50%` budget refers to)."""
    fmt = get_format(dtype, hidden=model.hidden)
    params = model.total_params
    return int(fmt.packed_bytes(params))


def plan_memory(model: ModelProfile, device: DeviceProfile, *, budget: str | int | SizeSpec | None = None,
                offload: float | None = None, weights_dtype: str | None = None,
                context_tokens: int = DEFAULT_CONTEXT_TOKENS, predictor: bool = True,
                split_scales: bool = True, runtime_bytes: int = DEFAULT_RUNTIME_BYTES) -> MemoryPlan:
    """Split a DRAM budget (or an FFN offload fraction) into resident parts and neuron cache.

    ``budget``: bytes, ``12GB``/``12GiB`` or ``50%`` of the model's weight bytes; default the
    device's usable DRAM. ``offload``: fraction of FFN weights kept only on flash (the other
    way to say it; mutually exclusive with ``budget``).
    """
    from sim.profiles.formats import check_dtype
    from sim.profiles.registry import load_device, load_model

    model, device = load_model(model), load_device(device)  # names, paths or (re-checked) objects
    dtype = check_dtype(weights_dtype) or model.default_dtype
    if budget is not None and offload is not None:
        raise SimError("give either a memory budget or an offload fraction, not both", field="--offload")
    context_tokens = check_int(context_tokens, "--context-tokens", 1, None)
    if offload is not None and (isinstance(offload, bool) or not isinstance(offload, numbers.Real)):
        raise SimError(f"must be a fraction in [0, 1], got {offload!r}", field="--offload")
    runtime_bytes = check_int(runtime_bytes, "runtime_bytes")  # whole bytes, >= 0
    predictor, split_scales = check_bool(predictor, "predictor"), check_bool(split_scales, "split_scales")
    if isinstance(budget, bool):
        raise SimError(f"expected a size such as 19GB, 12GiB or 50%, got {budget!r}", field="--memory-budget")
    bundle = model.bundle(dtype, device.storage.page_bytes)
    ffn_bytes = model.ffn_neurons_total * bundle.dram_bytes
    resident = resident_components(model, dtype, context_tokens, predictor=predictor,
                                   split_scales=split_scales, runtime_bytes=runtime_bytes)
    if not split_scales:  # scales travel with each neuron instead
        ffn_bytes = model.ffn_neurons_total * bundle.packed_bytes
        bundle_dram = bundle.packed_bytes
    else:
        bundle_dram = bundle.dram_bytes
    resident_total = sum(resident.values())
    if offload is not None:
        if not 0.0 <= offload <= 1.0:
            raise SimError(f"must be a fraction in [0, 1], got {offload}", field="--offload")
        cache = int(round((1.0 - offload) * ffn_bytes))
        budget_bytes = resident_total + cache
    else:
        if budget is None:
            spec = SizeSpec(bytes=device.dram.usable_bytes)
        elif isinstance(budget, SizeSpec):
            spec = budget
        elif isinstance(budget, int):
            if not 1 <= budget < 2**63:  # 10**400 bytes raised OverflowError while printing the refusal
                raise SimError(f"must be a size of 1 to 2**63 - 1 bytes, got an integer of {len(str(abs(budget)))} "
                               "digits" if budget >= 2**63 else f"must be at least 1 byte, got {budget}",
                               field="--memory-budget")
            spec = SizeSpec(bytes=budget)
        else:
            spec = parse_size_or_percent(budget, field="--memory-budget")
        budget_bytes = spec.resolve(model_weight_bytes(model, dtype))
        cache = budget_bytes - resident_total
        if cache < 0:
            parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in resident.items())
            what = (f"budget {format_bytes(budget_bytes)}" if budget is not None else
                    f"the default budget ({device.name}'s usable DRAM, dram.usable_bytes) {format_bytes(budget_bytes)}")
            raise SimError(
                f"{what} is below the {format_bytes(resident_total)} that must stay "
                f"resident ({parts}); allowed: at least {format_bytes(resident_total)}",
                field="--memory-budget")
    if budget_bytes > device.dram.usable_bytes:
        raise SimError(f"{format_bytes(budget_bytes)} exceeds the {format_bytes(device.dram.usable_bytes)} an app may "
                       f"use on {device.name}; allowed: at most {format_bytes(device.dram.usable_bytes)} "
                       "(edit the device profile's dram.usable_bytes to explore more)",
                       field="--memory-budget" if offload is None else "--offload")
    unused = max(0, cache - ffn_bytes)
    cache = min(cache, ffn_bytes)
    return MemoryPlan(model=model.name, device=device.name, weights_dtype=dtype, budget_bytes=budget_bytes,
                      resident=resident, ffn_bytes=ffn_bytes, neuron_cache_bytes=cache, unused_bytes=unused,
                      neuron_dram_bytes=bundle_dram, neuron_flash_bytes=bundle.flash_bytes,
                      context_tokens=context_tokens)
