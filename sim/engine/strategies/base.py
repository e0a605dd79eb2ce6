"""What an execution strategy is, and the registry the CLI's ``--strategy`` looks up.

A strategy decides what stays in DRAM, which processor runs which part of a layer, and
how flash reads overlap compute. It sees the hardware only through
:class:`~sim.engine.machine.Machine` and the model only through
:class:`~sim.engine.costs.ModelCosts` and the trace's per-layer work, so the same
hardware model serves every strategy. Knobs are a pydantic model per strategy with
defaults from the papers; users override them with ``--set key=value`` or a plan file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from sim.engine.costs import ModelCosts
from sim.engine.machine import Machine
from sim.engine.strategies.search import Family
from sim.engine.workload import LayerWork
from sim.errors import SimError
from sim.profiles.device import DeviceProfile
from sim.profiles.edits import plain
from sim.profiles.memory import MemoryPlan
from sim.profiles.model import ModelProfile
from sim.traces.format import TraceMeta

Event = Generator[Any, Any, Any]
# Where a strategy's compute may run (a knob such as ``prefill_unit``): the CPU's compute
# threads or one accelerator of the profile. check_options refuses a unit the device lacks.
Unit = Literal["cpu", "gpu", "npu"]
UNIT_KNOBS = ("prefill_unit", "decode_unit", "hot_unit")


class Knobs(BaseModel):
    """Base of every strategy's knobs: unknown knobs are errors, and so are NaN, infinities and
    an empty list of cores (which would silently mean the default).

    Strict, as profiles are: ``cluster_neurons: "256"`` or ``256.5`` and ``split_gate_read:
    "yes"`` are wrong types, not coerced; numpy scalars (a script looping over ``np.arange``)
    are taken as the Python numbers they are.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _plain_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {key: plain(value) for key, value in data.items()}

    @model_validator(mode="after")
    def _cores_named(self) -> Knobs:
        for name in ("compute_cores", "io_cores"):
            if getattr(self, name, None) == []:
                raise ValueError(f"{name} names no core; list cluster names, or leave it out for the default")
        return self


@dataclass
class TokenStats:
    """What one token did, filled in by the strategy while it runs."""

    hits: int = 0
    misses: int = 0
    requests: int = 0
    flash_bytes: int = 0
    phase_s: dict[str, float] = field(default_factory=dict)

    def add_phase(self, name: str, seconds: float) -> None:
        self.phase_s[name] = self.phase_s.get(name, 0.0) + seconds


@dataclass
class RunContext:
    """Everything a strategy needs for one run."""

    model: ModelProfile
    device: DeviceProfile
    plan: MemoryPlan
    costs: ModelCosts
    meta: TraceMeta
    machine: Machine
    popularity: np.ndarray  # activation count per flat neuron key (offline profile)
    prompt_tokens: int
    rng: np.random.Generator
    policy: str | None = None

    @property
    def dtype(self) -> str:
        return self.plan.weights_dtype

    @property
    def n_keys(self) -> int:
        return self.meta.n_layers * self.meta.n_experts * self.meta.n_neurons


class Strategy(ABC):
    """One execution strategy. Subclasses register themselves with :func:`register`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    knobs_model: ClassVar[type[Knobs]]
    uses_predictor: ClassVar[bool] = True  # predictors occupy DRAM
    reads_activations: ClassVar[bool] = True  # which neurons fire changes its figures (a trace matters)
    split_scales: ClassVar[bool] = True  # FFN scales resident, bundles without them in cache
    # per-token phase columns that are barriers on the compute threads (sim.engine.bottleneck);
    # the others overlap CPU, flash and accelerators
    cpu_phases: ClassVar[tuple[str, ...]] = ("attention_s", "predictor_s", "lm_head_s")
    keeps_profile: ClassVar[bool] = False  # holds the offline hot-neuron profile (profile-based policies need it)
    readers_share_compute: ClassVar[bool] = False  # flash readers run on the compute cores, not cores of their own
    # The mechanisms an ablation switches one at a time (`sim ablate`, sim.explore.ablation):
    # each name maps to the knob values that switch it off, in the order the strategy's
    # paper adds them to its baseline. Empty: nothing to ablate.
    mechanisms: ClassVar[dict[str, dict[str, Any]]] = {}
    # the knobs `sim plan` searches, in the order a plan spells them out; none: the strategy is not planned
    plan_knobs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ctx: RunContext, knobs: Knobs):
        self.ctx = ctx
        self.knobs = knobs

    # -- the strategy's own rules on a run (sim.engine.config.RunConfig), so that no module
    # outside a strategy's file tests its name.
    @classmethod
    def check_run(cls, run: dict[str, Any]) -> dict[str, Any]:
        """Check a run's options (no profile needed) against this strategy; return them, normalised.

        Called by :class:`~sim.engine.config.RunConfig`'s validator with every option; raises
        a one-line SimError naming the option the strategy cannot take."""
        return run

    @classmethod
    def memory_error(cls, exc: SimError) -> SimError:
        """The error to report when the memory plan refuses the run (the plan's own by default)."""
        return exc

    @classmethod
    def run_warnings(cls, config: Any) -> list[str]:
        """Warnings for options that change nothing in this strategy's figures."""
        if config.trace is not None and config.seed and not drawn_by_seed(config.trace, config.seed):
            return [f"--seed {config.seed} changes nothing with --trace: the trace fixes the activations"]
        return []

    # -- what `sim plan` searches (sim.explore.planner; the vocabulary is sim.engine.strategies.search)
    @classmethod
    def plan_space(cls, device: DeviceProfile) -> list[Family]:
        """The knob families ``sim plan`` searches on ``device``, in search order (see
        :mod:`~sim.engine.strategies.search`); they set only knobs of :attr:`plan_knobs`."""
        return []

    @classmethod
    def spelled_out(cls, knobs: dict[str, Any], device: DeviceProfile) -> dict[str, Any]:
        """``knobs`` (every knob, cores resolved) with what a default means on ``device`` written
        out, so a plan file says what runs (a knob whose None picks a unit, for one)."""
        return knobs

    @classmethod
    def default_cores(cls, device: DeviceProfile, needs_io: bool = True,
                      knobs: Any = None) -> tuple[list[str], list[str]]:
        """(compute cores, I/O cores) when the user gives none: see each strategy (``knobs``:
        the run's knob values, for a strategy whose default depends on one)."""
        return default_core_split(device, needs_io)

    @classmethod
    def default_compute_beside(cls, device: DeviceProfile, io_cores: list[str]) -> list[str]:
        """Compute cores when the user places the I/O threads but not the compute ones.

        The default's compute clusters, each less one core per I/O thread placed on it: a
        dedicated I/O thread moved to a slow core gives its fast core back to compute (it
        used to sit idle). Readers that share the compute cores take none.
        """
        if cls.readers_share_compute:
            return cls.default_cores(device)[0]
        return cores_beside(device, io_cores) or cls.default_cores(device)[0]

    @abstractmethod
    def prefill(self, stats: TokenStats) -> Event:
        """Process the prompt (all prompt tokens at once)."""

    @abstractmethod
    def decode_token(self, t: int, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> Event:
        """Generate one token: every layer, then the LM head."""

    def warm_token(self, t: int, layers: list[LayerWork], stats: TokenStats) -> None:
        """Replay a token through the strategy's cache untimed (warming it to the state after
        prefill). Strategies without a cache have nothing to do."""
        return None

    def analytic_token_s(self, layers: list[LayerWork], context_tokens: int, stats: TokenStats) -> float:
        """Closed-form time of one decode token (``--mode analytic``)."""
        raise SimError(f"strategy {self.name!r} has no analytic mode", field="--mode")

    # A strategy may split its analytic mode in two, so that sim.engine.reevaluate keeps the
    # first part (what the trace and the cache decide, the expensive replay) and redoes only the
    # second (the device's speeds) when a device or profile edit leaves the first unchanged.
    @classmethod
    def analytic_plan_key(cls, setup: Any) -> tuple | None:
        """What :meth:`analytic_plan` depends on besides the trace and the run's token counts
        (``setup``: a :class:`sim.engine.simulation.RunSetup`), or None when the analytic mode
        is not split (it is then re-evaluated whole)."""
        return None

    def analytic_plan(self, layers: list[LayerWork], stats: TokenStats) -> Any:
        """One decode token's part of the closed form that no device speed enters."""
        raise NotImplementedError

    def analytic_costs_s(self, plans: Any, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per plan (token) its closed-form time and flash bytes, ``contexts[i]`` tokens in the KV cache."""
        raise NotImplementedError

    # A split analytic mode may also answer any budget from one pass over the trace (the
    # budget moves the cache, which the plans depend on), for loops over budgets.
    @classmethod
    def budget_curve_key(cls, setup: Any) -> tuple | None:
        """What :meth:`budget_curve` depends on besides the trace and the run's token counts, or
        None when this strategy and its settings have no one-pass answer across budgets."""
        return None

    def budget_curve(self, tokens: Any, warmup_tokens: int) -> Any:
        """Read the warm-up and decode tokens (``(t, TokenWork)`` in order) once, for :meth:`budget_plans`."""
        raise NotImplementedError

    def budget_plans(self, curve: Any) -> Any:
        """The decode tokens' :meth:`analytic_plan` results at this strategy's budget, from ``curve``."""
        raise NotImplementedError


REGISTRY: dict[str, type[Strategy]] = {}


def drawn_by_seed(trace: Any, seed: int) -> bool:
    """Whether ``trace`` is a synthetic trace the run drew with ``seed`` (a calibrated run's trace,
    generated from its edited preset with the run's seed), so the seed did change the activations."""
    meta = getattr(trace, "meta", None)
    return isinstance(meta, TraceMeta) and meta.source == "synthetic" and meta.seed == seed


def register(cls: type[Strategy]) -> type[Strategy]:
    REGISTRY[cls.name] = cls
    return cls


def parse_knobs(cls: type[Strategy], values: dict[str, Any], source: str = "--set") -> Knobs:
    from sim.profiles.schema import validate

    known = cls.knobs_model.model_fields
    for key in values:
        if key not in known:  # name the strategy's knobs: the schema command lists profiles, not knobs
            raise SimError(f"unknown knob {key!r} of the {cls.name} strategy; its knobs: {', '.join(known)} "
                           f"(`sim strategies {cls.name}` describes them)", source=source, field=str(key))
    return validate(cls.knobs_model, values, source)


def default_core_split(device: DeviceProfile, needs_io: bool = True) -> tuple[list[str], list[str]]:
    """Compute on every core but a little cluster's; one I/O thread on a spare core.

    [PI2 §5] runs several compute threads and one I/O thread. The I/O thread goes to the
    multi-core cluster whose cores issue 4 KiB reads fastest (the CPU runs the UFS
    driver, [PI2 §2.3]); little cores are left out of compute (see :func:`_compute_clusters`).
    When nothing is read from flash during decode (the model fits), that core computes
    too; the I/O thread then only serves prefill's reads, if any.
    """
    clusters = _compute_clusters(device)
    io = max([c for c in clusters if c.cores > 1] or list(device.cpu.clusters), key=lambda c: c.io_4k_gbps)
    return cores_beside(device, [io.name] if needs_io else []) or [io.name], [io.name]


# A cluster whose cores compute at most this fraction of the fastest core's rate is a "little"
# cluster, left out of compute by default. [PI2 §5] leaves the little cores out; on the bundled
# phones they run 0.17-0.33 of the fastest core (an A520 beside an X4), while a SoC without
# little cores (Snapdragon 8 Elite: 2 prime and 6 performance Oryon cores, the latter at 0.82 of
# the prime's clock) would lose six fast cores to the old rule "drop the slowest cluster".
LITTLE_SPEED_RATIO = 0.5


def _compute_clusters(device: DeviceProfile, io_cores: list[str] | None = None) -> list:
    """The clusters compute threads go to: every cluster but a little one (see above), and the
    little one too when, beside the dedicated I/O threads ``io_cores``, the other clusters'
    remaining cores would compute less than its cores together. Then leaving it idle costs
    more than its stragglers: on the iPhone 15 Pro reading from flash, one performance core
    is left beside the I/O thread (Mistral-7B at --offload 0.5: 10.1 tokens/s alone, 17.0
    with the four efficiency cores), while with nothing to read the two performance cores
    beat all six (19.1 against 18.0)."""
    io_cores = io_cores or []
    clusters = list(device.cpu.clusters)
    slowest = min(clusters, key=lambda c: c.int8_gops)
    rest = [c for c in clusters if c is not slowest]
    if not rest or slowest.int8_gops > LITTLE_SPEED_RATIO * max(c.int8_gops for c in clusters):
        return clusters

    def rate(c: Any) -> float:
        return c.int8_gops * max(0, c.cores - io_cores.count(c.name))

    return clusters if sum(rate(c) for c in rest) < rate(slowest) else rest


def cores_beside(device: DeviceProfile, io_cores: list[str]) -> list[str]:
    """The compute clusters' cores, less one per dedicated I/O thread placed on them."""
    compute: list[str] = []
    for c in _compute_clusters(device, io_cores):
        compute += [c.name] * (c.cores - min(c.cores, io_cores.count(c.name)))
    return compute
