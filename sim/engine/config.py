"""One run's configuration: the options of ``sim run``, a sweep point, a validation point, a plan candidate.

:class:`RunConfig` is the single list of a run's options (its fields); everything else reads
them from here: :func:`sim.engine.simulation.simulate` takes one (its keyword form builds
one), ``sim run`` builds one from its flags, a sweep's run settings are its fields
(``RunConfig.defaults()``, not a function signature), and ``SimResult.config`` is the dump
of the configuration a run resolved to. :meth:`RunConfig.run_id` is its canonical hash.

The option rules that need no profile are its validators (token counts, seed, mode,
weights format, the strategy and its knobs, the cache policy against the strategy, and the
strategy's own rules through :meth:`~sim.engine.strategies.base.Strategy.check_run`); the
rules that need the device or model (context length, memory plan, cores, accelerators) are
:func:`sim.engine.simulation.check_options`'s. A bad option raises the same one-line
:class:`~sim.errors.SimError` naming its flag as before.
"""

from __future__ import annotations

import hashlib
import json
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.checks import check_int
from sim.errors import SimError
from sim.profiles.edits import PROFILE_PREFIXES

MODES = ("des", "analytic")
# Warm-up and profile tokens are trace tokens replayed before the timed ones (decode tokens
# are bounded by the model's context). A million is far past any useful warm-up and still
# under an hour of generation; a typo beyond it would otherwise run for days.
MAX_TRACE_TOKENS = 1_000_000
# The one default run length: sim run, sim plan's DES confirmations, sim validate, sim calibrate
# and sweeps decode this many tokens unless told otherwise (and print it), so one configuration
# is quoted at one speed everywhere. docs/steady_state.md says why the figure moves with length;
# `sim run --decode-tokens auto` runs until its confidence interval is tight instead.
DEFAULT_DECODE_TOKENS = 128


def option(default: Any, help: str, *, cli: str | None = None, flag: bool = True) -> Any:
    """A run option: its default and the help of its flag (``--decode-tokens`` for ``decode_tokens``),
    which ``sim run`` and every command taking run options derive from it
    (:mod:`sim.commands.run_options`). ``cli`` is the flag's value type (``text`` or ``path``) for
    a field that takes more than a command line can give (a profile object, a Trace); ``flag``
    False for an option no flag of its own sets."""
    extra = {"cli": cli} if cli else {}
    return Field(default, description=help, json_schema_extra={**extra, **({} if flag else {"flag": False})} or None)


class RunConfig(BaseModel):
    """A run: device and model (name, YAML path or profile object) with profile edits, strategy and
    knobs, memory, token counts, cache policy, activations (trace file/object or preset, seed) and mode.

    The fields are in the order ``sim run --help`` lists their flags.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, validate_default=True)

    device: Any = option("oneplus-12", "Device name or YAML path.", cli="text")  # or a DeviceProfile
    model: Any = option("turbosparse-mixtral-47b", "Model name or YAML path.", cli="text")  # or a ModelProfile
    strategy: str = option("powerinfer2", "powerinfer2, llm-in-flash, llamacpp, dense.")
    # whose program the calibration takes the run for: its implementation-scoped values apply
    implementation: str | None = option(
        None, "Whose implementation of the strategy the calibration treats the run as, e.g. llm-in-flash/pi2-port "
              "([PI2]'s port of LLM in a Flash): its calibrated values apply (default: the strategy's own).")
    # a size (19GB, 12GiB, bytes) or a percentage of the weights
    memory_budget: Any = option(None, "19GB, 12GiB or 50% (of weights).", cli="text")
    offload: float | None = option(None, "Fraction of FFN weights only on flash.")
    weights_dtype: str | None = option(None, "fp32, fp16, int8 or int4.")
    prompt_tokens: int = option(64, "Prompt length (prefill).")
    decode_tokens: int = option(DEFAULT_DECODE_TOKENS, "Tokens to generate.")
    warmup_tokens: int = option(16, "Trace tokens replayed to warm the cache.")
    profile_tokens: int | None = option(  # None: 64 for a preset's trace, 0 for a given trace
        None, "Trace tokens used as the offline profile (0: the decoded ones; default 64 for presets, 0 for --trace).")
    # a trace file path or a Trace; None: the preset's synthetic trace
    trace: Any = option(None, "Activation trace (.npz).", cli="path")
    preset: str | None = option(None, "Synthetic-trace preset (default: the model's).")
    policy: str | None = option(None, "Neuron-cache policy (e.g. lru, s3fifo).")
    seed: int = option(0, "Random seed.")
    mode: str = option("des", "des (discrete-event) or analytic (cost model).")
    knobs: dict[str, Any] = option(  # validated against the strategy's knob model
        {}, "The strategy's knobs as given (`sim run --set KNOB=VALUE` or --plan).", flag=False)
    overrides: dict[str, Any] = option(
        {}, "Profile edits applied to the device and model before the run, by field path: device.<path> or "
            "model.<path> to a value, :scale on the key to multiply (`sim run --set device.<path>=VALUE`).",
        flag=False)

    @model_validator(mode="before")
    @classmethod
    def _profile_free_rules(cls, data: Any) -> Any:
        """Every option rule that needs no profile, in the order ``check_options`` applied them."""
        from sim.engine.neuron_cache import check_timed_policy
        from sim.engine.strategies import get_strategy
        from sim.engine.strategies.base import parse_knobs
        from sim.profiles.formats import check_dtype

        if not isinstance(data, Mapping):
            raise SimError(f"expected a mapping of run options, got {type(data).__name__}", field="config")
        run = {name: field.default for name, field in cls.model_fields.items()}
        unknown = [key for key in data if key not in run]
        if unknown:
            raise SimError(f"unknown run option {unknown[0]!r}; run options: {', '.join(run)}", field=str(unknown[0]))
        run.update(data)
        if run["mode"] not in MODES:
            raise SimError(f"must be one of {', '.join(MODES)}; got {run['mode']!r}", field="--mode")
        run["prompt_tokens"] = check_int(run["prompt_tokens"], "--prompt-tokens", 1, None)
        run["decode_tokens"] = check_int(run["decode_tokens"], "--decode-tokens", 1, None)
        run["warmup_tokens"] = check_int(run["warmup_tokens"], "--warmup-tokens", 0, MAX_TRACE_TOKENS)
        if run["profile_tokens"] is not None:
            run["profile_tokens"] = check_int(run["profile_tokens"], "--profile-tokens", 0, MAX_TRACE_TOKENS)
        run["seed"] = check_int(run["seed"], "--seed")  # [0, 2**63 - 1]: stored as int64 (sweep rows, traces)
        check_dtype(run["weights_dtype"])
        offload, budget, policy = run["offload"], run["memory_budget"], run["policy"]
        if offload is not None and (isinstance(offload, bool) or not isinstance(offload, numbers.Real)):
            raise SimError(f"must be a fraction in [0, 1], got {offload!r}", field="--offload")
        if isinstance(budget, bool):
            raise SimError(f"expected a size such as 19GB, 12GiB or 50%, got {budget!r}", field="--memory-budget")
        if policy is not None:
            check_timed_policy(policy, keeps_profile=True)  # the name; the strategy's side is checked below
        run["overrides"] = _checked_overrides(run["overrides"])
        if not isinstance(run["strategy"], str):
            raise SimError(f"expected a strategy name, got {type(run['strategy']).__name__}", field="--strategy")
        strat_cls = get_strategy(run["strategy"])
        _check_implementation(run["implementation"], run["strategy"])
        knobs = run["knobs"]
        if knobs is not None and not isinstance(knobs, Mapping):
            raise SimError(f"expected a mapping of knob names to values, got {type(knobs).__name__}", field="knobs")
        run["knobs"] = dict(knobs or {})
        knob_values = parse_knobs(strat_cls, run["knobs"])
        knob_policy = getattr(knob_values, "policy", None)
        if policy is not None and "policy" in knob_values.model_fields_set and policy != knob_policy:
            raise SimError(f"{policy} contradicts knob policy={knob_policy}; give the cache policy once",
                           field="--policy")
        if policy is not None or knob_policy is not None:
            check_timed_policy(policy or knob_policy, strat_cls.keeps_profile,
                               field="--policy" if policy is not None else "knobs.policy")
        return strat_cls.check_run(run)

    @classmethod
    def of(cls, source: str = "run options", **options: Any) -> RunConfig:
        """A configuration from keyword options; a bad one is a one-line SimError, never a traceback."""
        from sim.profiles.schema import validate

        return validate(cls, options, source)  # a field's type, after the rules above (a list as --preset)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every run option and its default, in order (a sweep's run settings)."""
        return {name: field.get_default(call_default_factory=True) for name, field in cls.model_fields.items()}

    def dump(self) -> dict[str, Any]:
        """The options as plain data: profile objects as their names, a trace path as text."""
        out = {name: getattr(self, name) for name in type(self).model_fields}
        for kind in ("device", "model"):
            out[kind] = _profile_label(out[kind])
        trace = out["trace"]
        out["trace"] = str(trace) if isinstance(trace, str | Path) else (None if trace is None else "<in-memory>")
        out["knobs"] = dict(out["knobs"])
        out["overrides"] = dict(out["overrides"])
        return out

    def canonical(self) -> dict[str, Any]:
        """The options as hashable data: profile objects by their full contents."""
        out = self.dump()
        for kind in ("device", "model"):
            value = getattr(self, kind)
            if isinstance(value, BaseModel):
                out[kind] = value.model_dump(mode="json")
        if out["implementation"] is None:  # the strategy's own: ids as before the option existed
            del out["implementation"]
        trace = self.trace
        if trace is not None and not isinstance(trace, str | Path):
            out["trace"] = {"source": getattr(getattr(trace, "meta", None), "source", None), "id": id(trace)}
        return out

    def run_id(self, length: int = 16) -> str:
        """The configuration's canonical hash: equal options (in any spelling order) give equal ids."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"), default=str, allow_nan=True)
        return hashlib.sha256(text.encode()).hexdigest()[:length]


def _checked_overrides(overrides: Any) -> dict[str, Any]:
    """Profile edits as a plain mapping; each key addresses the device or the model profile
    (the edits themselves are checked against the profile they edit, by check_options)."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise SimError(f"expected a mapping of profile field paths to values, got {type(overrides).__name__}",
                       field="overrides")
    for key in overrides:
        if not isinstance(key, str) or not key.startswith(PROFILE_PREFIXES) or key in PROFILE_PREFIXES:
            raise SimError(f"a profile edit is device.<field path> or model.<field path>, got {key!r}",
                           field="overrides")
    return dict(overrides)


def _check_implementation(implementation: Any, strategy: str) -> None:
    """An implementation is the strategy's own or one the calibration registry scopes values to
    (``<strategy>/<whose>``): a name nothing is calibrated for would silently run as the strategy's own."""
    if implementation is None:
        return
    from sim.calibrate.unknowns import known_implementations

    allowed = known_implementations(strategy)
    if implementation not in allowed:
        raise SimError(f"must be one of {', '.join(allowed)} for strategy {strategy}, got {implementation!r}",
                       field="--implementation")


def _profile_label(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return getattr(value, "name", type(value).__name__)
    return str(value) if isinstance(value, Path) else value


def run_options() -> tuple[str, ...]:
    """The names of a run's options (RunConfig's fields)."""
    return tuple(RunConfig.model_fields)
