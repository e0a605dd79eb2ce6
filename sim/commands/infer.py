"""`sim infer`: run the numpy decoder LLM on a prompt, densely or with CATS-style sparsity."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.checks import check_int
from sim.errors import SimError

MAX_TOKENS = 4096


def register(app: typer.Typer) -> None:
    app.command("infer")(infer)


def infer(
    model: str = typer.Option("smollm2-135m", "--model", help="smollm2-135m (after `python -m sim.inference.fetch "
                                                              "smollm2`) or a Llama .gguf file."),
    prompt: str = typer.Option(..., "--prompt", help="Text to continue."),
    tokens: int = typer.Option(32, "--tokens", help=f"Tokens to generate (1..{MAX_TOKENS})."),
    density: float = typer.Option(1.0, "--density",
                                  help="Target FFN density in (0, 1]: below 1, each layer keeps neurons whose "
                                       "|SiLU(gate.x)| passes a threshold set on the prompt's dense prefill."),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy; above 0: sample at this temperature."),
    top_k: int = typer.Option(0, "--top-k", help="Sample among the k likeliest tokens (0: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler (with --temperature)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON: text, tokens, density, tokens_per_s."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Where fetched weights are cached."),
) -> None:
    """Generate a continuation with the numpy core; print it, the realised FFN density and tokens/s."""
    import numpy as np

    from sim.outputs import json_text

    check_int(tokens, "--tokens", 1, MAX_TOKENS)
    check_int(seed, "--seed")
    check_int(top_k, "--top-k")
    if not 0.0 < density <= 1.0:
        raise SimError(f"must be in (0, 1], got {density}", field="--density")
    if not 0.0 <= temperature <= 100.0:
        raise SimError(f"must be in [0, 100], got {temperature}", field="--temperature")
    if not prompt.strip():
        raise SimError("must not be empty", field="--prompt")
    from sim.inference.llama import load_llama, resolve_gguf
    from sim.inference.sparsify import calibrate

    resolve_gguf(model, cache_dir)  # a missing model fails before the load
    dec = load_llama(model, cache_dir)
    ids = dec.tok.encode(prompt)
    active = calibrate(dec.net, ids, density) if density < 1.0 else None
    gen = dec.generate(ids, tokens, active=active, temperature=temperature, top_k=top_k,
                       rng=np.random.default_rng(seed))
    out = {"model": dec.name, "prompt": prompt, "text": gen.text, "tokens": len(gen.ids),
           "token_ids": gen.ids.tolist(), "density": gen.density, "target_density": density,
           "tokens_per_s": gen.tokens_per_s}
    if json_out:
        print(json_text(out))
        return
    print(prompt + gen.text)
    print(f"[{dec.name}: {len(gen.ids)} tokens, FFN density {gen.density:.3f} (target {density:g}), "
          f"{gen.tokens_per_s:.2f} tokens/s (numpy core, decode)]")
