"""`sim memory`: how a DRAM budget splits into resident parts and the neuron cache."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from sim.commands.run_options import run_option
from sim.commands.settings import parse_sets, profile_sets
from sim.errors import SimError
from sim.profiles.edits import apply_overrides
from sim.profiles.memory import RUN_CONTEXT_TOKENS, RUN_DECODE_TOKENS, RUN_PROMPT_TOKENS, plan_memory
from sim.profiles.registry import load_device, load_model
from sim.units import format_bytes


def register(app: typer.Typer) -> None:
    app.command("memory")(memory)


def memory(
    device: str = run_option("device"),
    model: str = run_option("model"),
    memory_budget: str | None = run_option("memory_budget",
                                           help="DRAM budget: 7GB, 12GiB or 50% of the model's weights."),
    offload: float | None = run_option("offload", help="Fraction of FFN weights kept only on flash."),
    weights_dtype: str | None = run_option("weights_dtype"),
    context_tokens: int = typer.Option(
        RUN_CONTEXT_TOKENS, "--context-tokens",
        help=f"KV-cache length in tokens (default: sim run's prompt {RUN_PROMPT_TOKENS} + decode {RUN_DECODE_TOKENS}; "
             "a run sizes it for its --prompt-tokens + --decode-tokens)."),
    strategy: str = run_option("strategy", help="Whose layout: predictors and resident FFN scales depend on it."),
    sets: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE",
        help="Repeatable; VALUE is YAML; one edit per field. A profile field by its path as in sim run: device.<path> "
             "or model.<path> (model.predictor.rank=512, device.dram.usable_bytes=12GB)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show the DRAM breakdown for a model on a device at a budget or offload fraction."""
    from sim.engine.strategies import get_strategy
    from sim.outputs import json_text
    from sim.profiles.formats import check_dtype

    overrides, typed = parse_sets(sets)
    profile_sets(overrides)
    mod = load_model(apply_overrides("model", model, overrides))
    # A KV cache longer than the model can attend is a plan for a run that cannot happen.
    if context_tokens > mod.max_context:
        raise SimError(f"must be at most the model's max_context {mod.max_context}, got {context_tokens}",
                       field="--context-tokens")
    dev = load_device(apply_overrides("device", device, overrides))
    strat = get_strategy(strategy)
    # the strategy's own memory rules, as sim run applies them (dense: every weight in DRAM)
    offload = strat.check_run({"memory_budget": memory_budget, "offload": offload, "policy": None})["offload"]
    dtype = check_dtype(weights_dtype)
    try:
        plan = plan_memory(mod, dev, budget=memory_budget, offload=offload, weights_dtype=dtype,
                           context_tokens=context_tokens, predictor=strat.uses_predictor,
                           split_scales=strat.split_scales)
    except SimError as exc:  # as sim run words it (dense: the strategy, not an --offload the user never gave)
        raise strat.memory_error(exc) from None
    if json_out:
        print(json_text({**plan.to_dict(), "overrides": overrides}))
        return
    title = f"{plan.model} on {plan.device}, {plan.weights_dtype}, budget {format_bytes(plan.budget_bytes)}"
    title += f", KV cache for {plan.context_tokens} tokens"
    table = Table("component", "bytes", "GB", "share of budget", title=title)
    for row in plan.rows():
        table.add_row(str(row["component"]), f"{row['bytes']:,}", f"{row['bytes'] / 1e9:.3f}",
                      f"{row['share_of_budget']:.1%}")
    console = Console()
    for key in overrides:
        console.print(f"with --set {key}={typed[key]}", markup=False, highlight=False, soft_wrap=True)
    console.print(table)
    console.print(f"neuron cache holds {plan.ffn_resident_fraction:.2%} of the FFN weights "
                  f"({format_bytes(plan.ffn_bytes)}); {plan.cache_neurons:,} neurons of "
                  f"{plan.neuron_dram_bytes:,} B; flash read per neuron {plan.neuron_flash_bytes:,} B")
