"""Dense in-memory inference: every weight in DRAM, every neuron computed (the reference).

This is llama.cpp's behaviour when the model fits: decode streams all weights of the
experts a token uses through the CPU threads; prefill runs on the CPU too, or on the GPU or
NPU (``prefill_unit``), one call per layer over the whole prompt.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sim.engine.costs import Work
from sim.engine.strategies.base import Event, Knobs, Strategy, TokenStats, Unit, register
from sim.engine.strategies.serial import cpu, on_unit, run_steps
from sim.engine.workload import LayerWork
from sim.errors import SimError


class DenseKnobs(Knobs):
    compute_cores: list[str] | None = Field(None, description="compute threads, one CPU cluster name each "
                                                              "(default: every core but a little cluster's)")
    io_cores: list[str] | None = Field(None, description="unused: the dense strategy reads nothing")
    prefill_unit: Unit = Field("cpu", description="where prefill computes (llama.cpp's CPU backend; gpu as "
                                                  "[PI2 §2.3]'s GPU prefill)")


@register
class Dense(Strategy):
    name = "dense"
    summary = "Everything in DRAM, dense compute on the CPU (in-memory reference)"
    knobs_model = DenseKnobs
    uses_predictor = False
    reads_activations = False  # every weight is computed whatever fires
    split_scales = False

    @classmethod
    def check_run(cls, run: dict[str, Any]) -> dict[str, Any]:
        """Every weight stays in DRAM: no budget, offload or cache policy to give (offload is 0)."""
        if run["memory_budget"] is not None or run["offload"] not in (None, 0, 0.0):
            raise SimError("the dense strategy keeps every weight in DRAM; drop --memory-budget/--offload",
                           field="--strategy")
        if run["policy"] is not None:
            raise SimError("the dense strategy keeps every weight in DRAM and has no cache; drop --policy",
                           field="--policy")
        return {**run, "offload": 0.0}

    @classmethod
    def memory_error(cls, exc: SimError) -> SimError:
        if exc.field != "--offload":
            return exc
        # dense set no offload of its own: the model does not fit in DRAM at all
        return SimError(f"the dense strategy keeps every weight in DRAM: {exc.detail}", field="--strategy")

    @classmethod
    def run_warnings(cls, config: Any) -> list[str]:
        if config.trace is not None or config.preset is not None or config.seed:
            return ["the dense strategy computes every weight whatever fires: --trace, --preset and --seed change "
                    "nothing in its figures"]
        return []

    def decode_token(self, t: int, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> Event:
        m, costs, dtype, env = self.ctx.machine, self.ctx.costs, self.ctx.dtype, self.ctx.machine.env
        for work in layers:
            t0 = env.now
            w = costs.attention(context_tokens) + costs.router()
            yield from m.cpu_parallel("attention", w.weight_bytes, w.ops, dtype)
            t1 = env.now
            w = costs.dense_ffn()
            yield from m.cpu_parallel("ffn", w.weight_bytes, w.ops, dtype)
            n = self.ctx.model.top_k * self.ctx.model.ffn_dim
            stats.requests += n
            stats.hits += n
            stats.add_phase("attention_s", t1 - t0)
            stats.add_phase("ffn_s", env.now - t1)
            _ = work
        t2 = env.now
        w = costs.lm_head()
        yield from m.cpu_parallel("lm_head", w.weight_bytes, w.ops, dtype)
        stats.add_phase("lm_head_s", env.now - t2)

    def prefill(self, stats: TokenStats) -> Event:
        ctx, costs, p = self.ctx, self.ctx.costs, self.ctx.prompt_tokens
        w = costs.attention(p, batch=p) + costs.dense_ffn(batch=p)
        layer = on_unit(costs, ctx.device, self.knobs.prefill_unit, "prefill_s", "prefill", w,
                        costs.dense_layer_weights(), batch=p, kernel="gemm")
        head = costs.lm_head()
        steps = layer * ctx.model.n_layers + [cpu("lm_head_s", "lm_head", head.weight_bytes, head.ops, ctx.dtype)]
        yield from run_steps(ctx.machine, steps, stats)

    def analytic_token_s(self, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> float:
        m, costs = self.ctx.machine, self.ctx.costs

        def parallel(w: Work) -> float:
            return m.parallel_time_s(w.weight_bytes, w.ops, self.ctx.dtype)

        per_layer = parallel(costs.attention(context_tokens) + costs.router()) + parallel(costs.dense_ffn())
        n = self.ctx.model.top_k * self.ctx.model.ffn_dim * len(layers)
        stats.requests += n  # every neuron of the chosen experts, all resident (as in decode_token)
        stats.hits += n
        return per_layer * len(layers) + parallel(costs.lm_head())
