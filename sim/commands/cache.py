"""`sim cache ...`: compare neuron-cache policies on a trace or a plain request stream."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from sim.errors import SimError
from sim.units import format_bytes, parse_bytes

app = typer.Typer(help="Compare neuron-cache policies (miss-ratio curves, flash traffic).", no_args_is_help=True)

_POLICY_HELP = ("Comma-separated policies, or 'all': lru, fifo, lfu, clock, s3fifo, sieve, arc, static-hot, "
                "window, pi2-segmented, belady.")


@app.command("compare")
def compare(
    trace: Path | None = typer.Option(None, "--trace", help="Activation trace (.npz) to replay."),
    requests: Path | None = typer.Option(None, "--requests",
                                         help="Request stream CSV with columns step,key[,size]."),
    policies: str = typer.Option("all", "--policies", help=_POLICY_HELP),
    sizes: str = typer.Option("1%,5%,10%,25%,50%", "--sizes",
                              help="Cache sizes: bytes (50, 2MiB) or % of all FFN/item bytes, comma-separated."),
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    out: Path | None = typer.Option(None, "--out", help="Write the rows to a .csv (or .parquet) file."),
    plot: Path | None = typer.Option(None, "--plot",
                                     help="Write the miss-ratio and flash-traffic plot (PNG, PDF, SVG)."),
    neuron_bytes: str | None = typer.Option(
        None, "--neuron-bytes", help="Bytes per neuron (trace only; default 1, e.g. 8KiB for an INT4 bundle)."),
    granularity: str = typer.Option("neuron", "--granularity", help="neuron or cluster (trace only)."),
    cluster_neurons: int = typer.Option(32, "--cluster-neurons", help="Neurons per cluster (cluster granularity and "
                                        "pi2-segmented's hot clusters)."),
    split: str = typer.Option("shared", "--split",
                              help="shared: one cache for all layers; per-layer: an equal share each."),
    window_tokens: int = typer.Option(5, "--window-tokens", help="Tokens kept by the window policy."),
    hot_fraction: float = typer.Option(0.5, "--hot-fraction",
                                       help="Share of the cache pi2-segmented gives its hot region."),
    profile: Path | None = typer.Option(None, "--profile", help="Profiling trace for static-hot / pi2-segmented "
                                        "(default: the replayed trace itself)."),
    warmup_tokens: int = typer.Option(0, "--warmup-tokens",
                                      help="Serve but do not count the first N tokens (steps for --requests)."),
) -> None:
    """Replay a trace or request stream through cache policies at several sizes."""
    from sim.cache.compare import compare_requests, compare_trace, parse_policies
    from sim.cache.layout import GRANULARITIES, SPLITS
    from sim.outputs import check_output, json_text
    from sim.traces.format import Trace

    if (trace is None) == (requests is None):
        raise SimError("give exactly one of --trace T.npz or --requests R.csv", field="--trace")
    # Before any replay: a result that cannot be saved is work lost.
    inputs = {"--trace": trace, "--requests": requests, "--profile": profile}
    check_output(out, "--out", suffixes=(".csv", ".parquet"), inputs=inputs)
    check_output(plot, "--plot", suffixes=(".png", ".pdf", ".svg"), inputs=inputs)
    names = parse_policies(policies)
    options = {"window_tokens": window_tokens, "hot_fraction": hot_fraction, "warmup_tokens": warmup_tokens}
    if window_tokens < 1:
        raise SimError(f"must be >= 1, got {window_tokens}", field="--window-tokens")
    if not 0.0 <= hot_fraction <= 1.0:
        raise SimError(f"must be in [0, 1], got {hot_fraction}", field="--hot-fraction")
    if cluster_neurons < 1:
        raise SimError(f"must be >= 1, got {cluster_neurons}", field="--cluster-neurons")
    for flag, value, allowed in (("--granularity", granularity, GRANULARITIES), ("--split", split, SPLITS)):
        if value not in allowed:  # named by the flag here, not by the library's field
            raise SimError(f"must be one of {', '.join(allowed)}; got {value!r}", field=flag)
    if trace is not None:
        tr = Trace.load(trace)
        prof = Trace.load(profile) if profile is not None else None
        nb = parse_bytes(neuron_bytes, field="--neuron-bytes") if neuron_bytes is not None else 1
        df = compare_trace(tr, names, sizes, neuron_bytes=nb, granularity=granularity,
                           cluster_neurons=cluster_neurons, split=split, profile=prof, **options)
        title = f"{tr.meta.model}: {tr.meta.n_tokens} tokens ({tr.meta.source} trace, {granularity}s, {split})"
        if warmup_tokens:
            title += f", counted after {warmup_tokens} warm-up tokens"
    else:
        assert requests is not None
        for flag, given in (("--neuron-bytes", neuron_bytes is not None), ("--profile", profile is not None),
                            ("--granularity", granularity != "neuron"), ("--split", split != "shared")):
            if given:
                raise SimError("applies to --trace only (a request CSV carries its own sizes and keys)", field=flag)
        df = compare_requests(requests, names, sizes, cluster_neurons=cluster_neurons, **options)
        title = f"{requests.name}: {int(df['tokens'].iloc[0]) if len(df) else 0} steps"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix.lower() == ".parquet":
            df.to_parquet(out, index=False)
        else:
            df.to_csv(out, index=False)
    if plot is not None:
        from sim.plots import plot_cache_comparison

        plot_cache_comparison(df, plot, title=title)
    if json_out:
        print(json_text(json.loads(df.to_json(orient="records"))))
        return
    table = Table("policy", "capacity", "% of items", "hit ratio", "miss ratio", "flash/token", title=title)
    for r in df.itertuples(index=False):
        table.add_row(r.policy, format_bytes(r.capacity_bytes), _fixed(r.capacity_pct, 2), _fixed(r.hit_ratio, 4),
                      _fixed(r.miss_ratio, 4), format_bytes(r.flash_bytes_per_token))
    console = Console()
    console.print(table)
    for label, path in (("rows", out), ("plot", plot)):
        if path is not None:
            console.print(f"wrote {label}: {path}")


def _fixed(value: float, digits: int) -> str:
    """``value`` to ``digits`` decimals, or ``-`` when there is none (no items, no requests): never ``nan``."""
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"
