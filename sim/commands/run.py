"""`sim run`: simulate one configuration and print tokens/s and where the time goes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from sim.commands.run_options import with_run_options
from sim.commands.settings import own_preset, parse_sets
from sim.errors import SimError
from sim.explore.uncertainty import DEFAULT_SAMPLES
from sim.profiles.edits import PROFILE_PREFIXES, apply_overrides


def register(app: typer.Typer) -> None:
    app.command("run")(run)


# What `sim plan` writes (sim.explore.planner.PlanResult.plan_mapping): a plan file holds nothing else.
PLAN_KEYS = {"strategy", "device", "model", "memory_budget", "overrides", "profile_hashes", "objective", "knobs",
             "predicted", "default_configuration", "runners_up"}


def _plan_knobs(path: Path, strategy: str, run: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The knobs of a ``sim plan`` file (or a bare knob mapping), checked against this run.

    A plan's knobs belong to one strategy, so a plan for another is an error naming the
    file; a plan made for another device, model or budget still runs (the knobs may
    transfer) but says so, since its predicted figures do not apply.
    """
    from sim.engine.strategies import get_strategy
    from sim.engine.strategies.base import parse_knobs
    from sim.profiles.yamlio import load_yaml_file

    loaded = load_yaml_file(path)
    plan_keys = set(loaded) & PLAN_KEYS - {"knobs"}
    if "knobs" not in loaded and plan_keys:  # a plan whose knobs section is missing or misspelt
        raise SimError(f"has plan fields ({', '.join(sorted(plan_keys))}) but no knobs section; a plan file holds "
                       "its knobs under knobs:, a bare knob file holds knobs only", source=str(path), field="knobs")
    if "knobs" in loaded:
        unknown = sorted(set(loaded) - PLAN_KEYS)
        if unknown:
            raise SimError(f"unknown field(s) {', '.join(map(repr, unknown))} in a plan; a plan has: "
                           f"{', '.join(sorted(PLAN_KEYS))}", source=str(path), field=unknown[0])
    knobs = loaded.get("knobs", {}) if "knobs" in loaded else loaded
    if not isinstance(knobs, dict):
        raise SimError(f"must be a mapping of strategy knobs (key: value), got {type(knobs).__name__}",
                       source=str(path), field="knobs")
    made_for = loaded.get("strategy")
    if made_for is not None and made_for != strategy:
        raise SimError(f"the plan's knobs are for the {made_for} strategy; this run uses {strategy} "
                       f"(pass --strategy {made_for})", source=str(path), field="strategy")
    parse_knobs(get_strategy(strategy), dict(knobs), source=f"{path}: knobs")
    planned_edits = loaded.get("overrides") or {}
    hashes = loaded.get("profile_hashes")
    notes = []
    for kind in ("device", "model"):
        if isinstance(hashes, dict) and kind in hashes:  # the profiles themselves, however they were edited
            if hashes[kind] != run["hashes"][kind]:
                notes.append(f"another {kind} profile: {loaded.get(kind)}{_edits(planned_edits, kind)} "
                             f"(this run: {run[kind]}{_edits(run['overrides'], kind)})")
        elif ((kind in loaded and str(loaded[kind]) != str(run[kind]))  # a plan without profile digests
              or _edits(planned_edits, kind) != _edits(run["overrides"], kind)):
            notes.append(f"{kind} {loaded.get(kind, run[kind])}{_edits(planned_edits, kind)} "
                         f"(this run: {run[kind]}{_edits(run['overrides'], kind)})")
    if "memory_budget" in loaded and str(loaded["memory_budget"]) != str(run["memory_budget"]):
        notes.append(f"memory_budget {loaded['memory_budget']} (this run: {run['memory_budget']})")
    warnings = [f"{path} was planned for {', '.join(notes)}; its knobs are applied as they are"] if notes else []
    return knobs, warnings


def _edits(overrides: dict[str, Any], kind: str) -> str:
    mine = [f"{key}={value}" for key, value in overrides.items() if key.startswith(f"{kind}.")]
    return f" with --set {', '.join(mine)}" if mine else ""


def _profile_hashes(device: Any, model: Any) -> dict[str, str]:
    """Digests of the profiles a run uses, as a plan records them (sim.explore.resolve.digest)."""
    from sim.explore.resolve import digest
    from sim.profiles.registry import load_device, load_model

    return {"device": digest(load_device(device).model_dump(mode="json")),
            "model": digest(load_model(model).model_dump(mode="json"))}


@with_run_options(wider=("decode_tokens",))
def run(
    plan: Path | None = typer.Option(None, "--plan", help="YAML of strategy knobs (e.g. from `sim plan`)."),
    sets: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE",
        help="Repeatable; VALUE is YAML; one edit per field. A strategy knob (cluster_neurons=256; overrides --plan), "
             "or a profile field by its path as in a sweep: device.<path> or model.<path>, list entries by name, "
             "index or * (device.cpu.clusters.big.cores=3), :scale to multiply "
             "(device.storage.rand_read.*.gbps:scale=2)."),
    timeline: Path | None = typer.Option(None, "--timeline", help="Write Chrome/Perfetto trace JSON."),
    gantt: Path | None = typer.Option(None, "--gantt",
                                      help="Draw a Gantt chart of the first tokens (.png, .pdf or .svg)."),
    tokens_csv: Path | None = typer.Option(None, "--tokens-csv", help="Write per-token rows as CSV."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    calibration: str | None = typer.Option(
        None, "--calibration", help="Calibrated unknowns to apply (`sim calibrate --out`): default the bundled "
                                    "validation/calibration.yaml; none: the microbenchmark-only prediction."),
    uncertainty: bool = typer.Option(
        False, "--uncertainty", help="Sample the calibrated unknowns' uncertainty (their prior ranges on a device or "
                                     "model no published point covers) and print the median and 90% interval."),
    samples: int = typer.Option(DEFAULT_SAMPLES, "--samples", help="Samples for --uncertainty (analytic evaluations)."),
    **options: Any,
) -> None:
    """Simulate prefill and decode of a model on a device; print tokens/s and a breakdown."""
    from sim import kernel_warmup
    from sim.outputs import PLOT_SUFFIXES, check_output, json_text

    # Outputs are checked before the run, so a finished simulation is never lost to a bad path.
    inputs = input_files(**options, plan=plan)
    check_output(timeline, "--timeline", suffixes=(".json",), inputs=inputs)
    check_output(gantt, "--gantt", suffixes=PLOT_SUFFIXES, inputs=inputs)
    check_output(tokens_csv, "--tokens-csv", suffixes=(".csv",), inputs=inputs)
    if options["mode"] == "analytic":
        for flag, value in (("--timeline", timeline), ("--gantt", gantt)):
            if value is not None:
                raise SimError("the analytic cost model has no timeline; drop it or use --mode des", field=flag)
    request = run_request(plan=plan, sets=sets, calibration=calibration, **options)
    with request.knob_errors():
        helper = kernel_warmup.start(request.config)  # a first run: the engine's kernels compile beside the trace's
        try:
            result = request.simulate(timeline=timeline is not None or gantt is not None)
        finally:
            kernel_warmup.stop(helper)
    if uncertainty:
        add_interval(result.summary, request, samples)
    result.summary["warnings"] = request.warnings + list(result.summary.get("warnings", []))
    result.summary["calibration"] = request.calibration
    if timeline is not None:
        from sim.engine.timeline import write_perfetto

        write_perfetto(result.spans, timeline)
    if gantt is not None:
        from sim.plots import draw_gantt

        draw_gantt(result.spans, gantt)
    if json_out:
        # the run's configuration as resolved (defaults, knobs, core layout) rides along for reproducibility
        # the base profiles as given and the edits on them (its overrides) make the run reproducible
        config = {**result.config, "base_profiles": {"device": options["device"], "model": options["model"]}}
        print(json_text({**result.summary, "config": config}), flush=True)
    else:
        _print_table({**result.summary, "config": result.config}, request)
    if tokens_csv is not None:  # after the results, so a write that fails (a full disk) loses only the CSV
        try:
            result.tokens.to_csv(tokens_csv, index=False)
        except OSError as exc:
            raise SimError(f"cannot write the per-token CSV (the results above are complete): "
                           f"{exc.strerror or exc}", source=str(tokens_csv), field="--tokens-csv") from None


# sim run's flags that say where its results go, not what runs: the rest are the run options
# (RunConfig's, sim.commands.run_options) and --plan/--set, which `sim ablate` takes too
# (sim.commands.ablate reads them from run's signature).
OUTPUT_FLAGS = ("timeline", "gantt", "tokens_csv", "json_out", "uncertainty", "samples")


def add_interval(summary: dict[str, Any], request: RunRequest, samples: int) -> None:
    """``decode_tokens_per_s_interval`` (median, 90%) from the calibrated unknowns' uncertainty."""
    from sim.checks import check_int
    from sim.explore.uncertainty import prediction_interval

    check_int(samples, "--samples", 2, 10_000)
    if request.applied is None:
        raise SimError("needs a calibration to sample (drop --calibration none)", field="--uncertainty")
    with request.knob_errors():
        interval = prediction_interval(request.uncalibrated, request.applied, summary["decode_tokens_per_s"],
                                       samples=samples, seed=request.config.seed, user_paths=request.user_paths)
    summary["decode_tokens_per_s_interval"] = {"median": interval.median, "lo": interval.lo, "hi": interval.hi,
                                               "level": 0.9, "samples": len(interval.samples),
                                               "unknowns": interval.sources}


def input_files(**options: Any) -> dict[str, Any]:
    """The run options that name files an output must not overwrite, by flag."""
    return {f"--{name}": options[name] for name in ("device", "model", "trace", "plan")}


@dataclass
class RunRequest:
    """What sim run's options resolve to before anything runs: the configuration, the ``--set``
    edits as typed (printed above the figures) and the plan file's warnings."""

    config: Any  # sim.engine.config.RunConfig
    typed: dict[str, str]
    overrides: dict[str, Any]  # the profile edits among the --set values
    warnings: list[str]
    settings: dict[str, Any]  # every --set value, parsed
    knobs: dict[str, Any]  # from --plan and --set
    plan: Path | None
    calibration: str = "none"  # the calibration applied (its file), or none
    auto_length: bool = False  # --decode-tokens auto: config.decode_tokens is the first run's length
    uncalibrated: Any = None  # the RunConfig before the calibration, to re-apply it at another length
    applied: Any = None  # the calibration (sim.calibrate.calibration), or None
    user_paths: tuple[str, ...] = ()  # what the user set, which the calibration leaves alone

    def variant(self, **changes: Any) -> Any:
        """The run's configuration with other run options (seed, decode_tokens), calibrated as the run is."""
        from sim.calibrate.apply import calibrated_config

        if all(getattr(self.config, key) == value for key, value in changes.items()):
            return self.config
        return calibrated_config(self.uncalibrated.model_copy(update=changes), self.applied,
                                 user_paths=self.user_paths)

    def simulate(self, **simulate_options: Any) -> Any:
        """The run (a SimResult): of the configuration's length, or until steady under ``auto``."""
        from sim.engine.run_length import simulate_until_steady
        from sim.engine.simulation import simulate

        if self.auto_length:
            return simulate_until_steady(self.config, self.variant, **simulate_options)
        return simulate(self.config, **simulate_options)

    @contextmanager
    def knob_errors(self) -> Iterator[None]:
        """A knob's error names where the knob was given: ``--set KNOB`` or the plan file's field."""
        try:
            yield
        except SimError as exc:
            knob = exc.field.split(".")[0] if exc.field and exc.field != "(top level)" else None
            if exc.source == "--set" or (exc.source is None and knob in self.knobs):
                if knob is None or knob in self.settings or self.plan is None:
                    raise SimError(exc.detail, field=f"--set {exc.field}" if knob else "--set") from None
                raise SimError(exc.detail, source=str(self.plan), field=f"knobs.{exc.field}") from None
            raise


def run_request(*, plan: Path | None, sets: list[str], calibration: str | None = None, **options: Any) -> RunRequest:
    """The :class:`RunRequest` of sim run's run options (every flag but :data:`OUTPUT_FLAGS`): the
    flagged fields of RunConfig, ``--plan``, ``--set`` and ``--calibration`` (default: the bundled
    calibration's values where their scope covers the run; a value the user set is the user's)."""
    from sim.calibrate.apply import calibrated_config
    from sim.calibrate.calibration import load_calibration
    from sim.engine.config import DEFAULT_DECODE_TOKENS, RunConfig
    from sim.engine.run_length import AUTO, parse_decode_tokens

    cal = load_calibration(calibration)  # a bad file fails before anything runs
    decode_tokens = parse_decode_tokens(options["decode_tokens"])
    options = {**options, "decode_tokens": DEFAULT_DECODE_TOKENS if decode_tokens == AUTO else decode_tokens}

    settings, typed = parse_sets(sets)
    overrides = {key: value for key, value in settings.items() if key.startswith(PROFILE_PREFIXES)}
    knobs: dict[str, Any] = {}
    plan_warnings: list[str] = []
    device, model = options["device"], options["model"]
    # the edited profiles now, so a bad edit is reported before anything else (the run applies them again)
    edited = {kind: apply_overrides(kind, options[kind], overrides) for kind in ("device", "model")}
    if plan is not None:
        budget, offload = options["memory_budget"], options["offload"]
        budget = budget or (f"offload {offload}" if offload is not None else "the device's usable DRAM")
        plan_knobs, plan_warnings = _plan_knobs(plan, options["strategy"], {
            "device": device, "model": model, "memory_budget": budget, "overrides": overrides,
            "hashes": _profile_hashes(edited["device"], edited["model"])})
        knobs.update(plan_knobs)
    knobs.update({key: value for key, value in settings.items() if key not in overrides})
    preset = own_preset(model, overrides, options["trace"], options["preset"])
    request = RunRequest(None, typed, overrides, plan_warnings, settings, knobs, plan)
    with request.knob_errors():
        request.config = RunConfig.of(source="sim run", **{**options, "preset": preset}, knobs=knobs,
                                      overrides=overrides)
        request.uncalibrated, request.applied, request.user_paths = request.config, cal, (*overrides, *knobs)
        request.config = calibrated_config(request.config, cal, user_paths=request.user_paths)
    request.calibration = cal.source if cal is not None else "none"
    request.auto_length = decode_tokens == AUTO
    return request


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)


def steady_text(s: dict[str, Any]) -> str:
    """The steady state's figure and 95% interval, and the warm-up it follows."""
    steady, ci = s["steady_state"], s.get("decode_tokens_per_s_ci")
    interval = f"[{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "(too few tokens for an interval)"
    if "replications" in steady:
        return f"{steady['decode_tokens_per_s']:.4g} {interval} over {steady['replications']} replications"
    return f"{steady['decode_tokens_per_s']:.4g} {interval} after {steady['warmup_tokens']} warm-up tokens"


def length_text(s: dict[str, Any]) -> str:
    """How many tokens the run decoded, and under ``auto`` the lengths it tried."""
    n = s.get("config", {}).get("decode_tokens")
    auto = s.get("decode_tokens_auto")
    if auto:
        return (f"decode tokens: {n} (auto: {auto['replications']} replications, on seed {auto['seeds'][0]} and "
                f"seeds drawn from it, until the 95% interval's half-width is within "
                f"{auto['target_half_width']:.0%}, at most {auto['max_replications']}; the figures below "
                f"decode_tokens_per_s are seed {auto['seeds'][0]}'s)")
    return f"decode tokens: {n}"


def print_edits(console: Console, request: RunRequest) -> None:
    """A what-if says so before its figures: each profile edit, as it was typed."""
    for key in request.overrides:
        console.print(f"with --set {key}={request.typed[key]}", markup=False, highlight=False, soft_wrap=True)


def _print_table(s: dict[str, Any], request: RunRequest) -> None:
    console = Console()
    print_edits(console, request)
    head = Table(title=f"{s['model']} on {s['device']} ({s['strategy']}, {s['mode']})", show_header=False)
    for key in ("decode_tokens_per_s", "prefill_tokens_per_s", "ttft_s", "latency_ms_mean", "latency_ms_p50",
                "latency_ms_p99", "cache_hit_ratio", "cache_miss_ratio_mean", "cache_miss_ratio_p99",
                "flash_bytes_per_token", "dram_bytes_per_token", "energy_j_per_token"):
        if key in s:
            head.add_row(key, _fmt(s[key]))
        if key == "decode_tokens_per_s" and s.get("steady_state"):
            head.add_row("  steady state, 95% CI", steady_text(s))
        if key == "decode_tokens_per_s" and s.get("decode_tokens_per_s_interval"):
            i = s["decode_tokens_per_s_interval"]
            spread = ", ".join(f"{k} ({v})" for k, v in i["unknowns"].items()) or "no unknown reaches this run"
            head.add_row("  90% prediction interval", f"{i['median']:.4g} [{i['lo']:.4g}, {i['hi']:.4g}] over "
                                                        f"{i['samples']} samples of {spread}")
    console.print(head)
    console.print(length_text(s), markup=False, highlight=False, soft_wrap=True)
    if s.get("bottleneck"):
        binds = Table("phase", "bottleneck", "share of the phase's time", title="what binds")
        for phase, b in [*s["bottleneck"]["phases"].items(), ("token", s["bottleneck"]["token"])]:
            binds.add_row(phase, b["resource"], ", ".join(f"{k} {v:.0%}" for k, v in
                                                          sorted(b["shares"].items(), key=lambda kv: -kv[1])))
        console.print(binds)
    console.print(f"calibration: {s.get('calibration', 'none')}", markup=False, highlight=False, soft_wrap=True)
    if s["phases_ms_per_token"]:  # the cost model of some strategies has no phases
        phases = Table("phase", "ms per token", title="where decode time goes")
        for name, ms in s["phases_ms_per_token"].items():
            phases.add_row(name, f"{ms:.2f}")
        console.print(phases)
    context = s.get("config", {}).get("prompt_tokens", 0) + s.get("config", {}).get("decode_tokens", 0)
    mem = Table("component", "GB", title=f"DRAM ({context}-token KV cache)")  # prompt + decode
    for name, value in s["memory"].items():
        if name != "ffn_resident_fraction":
            mem.add_row(name, f"{value / 1e9:.3f}")
    mem.add_row("FFN resident", f"{s['memory']['ffn_resident_fraction']:.1%}")
    console.print(mem)
    for key, phase in (("prefill_utilisation", "prefill"), ("utilisation", "decode")):
        title = f"utilisation during {phase}"
        if s.get(key):
            util = Table("unit", "busy", title=title)
            for unit, frac in s[key].items():
                util.add_row(unit, f"{frac:.1%}")
            console.print(util)
    if s.get("trace_derived_from"):  # the model has no preset of its own: say where its activations came from
        from sim.traces.derived import origins_text

        console.print(f"trace: derived preset {s['trace_preset']} ({origins_text(s['trace_derived_from'])}; "
                      f"sim trace presets {s['trace_preset']} shows it)", markup=False, highlight=False)
    for warning in s.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}")
