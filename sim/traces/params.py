"""Parameters of the synthetic trace generator, their YAML form and the bundled presets.

A parameter set describes activation statistics *per layer and per token*, never per
neuron id, so that it transfers between models of different width and depth:

- ``density``: mean fraction of one expert's FFN neurons active per token (a fraction).
- ``propensity``: the shape of the per-neuron activation-probability distribution, as a
  function of the neuron's rank fraction ``u`` (0 = hottest). Either a log-normal-like
  parametric family (``dist: logitnormal``, ``sigma``) or a fitted quantile curve
  (``dist: empirical``, knots ``rank`` and ``logit``). The location is solved per layer
  so that the mean propensity equals the layer's density exactly.
- ``persistence``: lag-1 autocorrelation of one neuron's on/off activity (0 = independent
  tokens, towards 1 = the active set barely changes).
- ``coactivation``: optional groups of similarly popular neurons that switch on together.
- ``drift`` (optional, off by default): context shifts. At each token, with probability
  ``rate`` (one draw for the whole model: a topic change reaches every layer at once), a
  share ``share`` (per layer) of every expert pool's neurons trade propensities among
  themselves, so a different set of neurons becomes hot. This is what gives per-token
  cache misses a heavy tail; independent neuron chains alone have none. ``spacing:
  regular`` places one shift in every block of ``1 / rate`` tokens instead (default
  ``random``). ``static`` (default 0): the hottest neurons carrying this share of a
  pool's activations are hot in every context and never re-drawn; ``share`` applies to
  the others. ``duration`` (tokens, default 0 = for good): a shift is an excursion that
  lasts this many tokens, after which the same neurons trade their propensities back
  (the prompt's context returns, as after a name, a number or a quoted span).
- ``routing`` (MoE): per-layer expert popularity and token-to-token expert persistence.
- ``predictor``: recall and precision (or false-positive rate over inactive neurons) of the
  activation predictor, used to produce the predicted sets.

Per-layer quantities are a number, a list (one per layer; a list of another length is
interpolated over relative depth 0..1, so a 6-layer fit drives a 32-layer model), or a
mapping ``{at: [depths], value: [values]}`` of anchors at relative depths.

Every group in a bundled preset carries ``source`` (paper, table, section),
``calibrated`` (tuned to reproduce a published figure, which is named), ``fitted`` (by
``sim trace fit`` on a named trace) or ``assumed`` (why) -- the tests enforce it. A preset
derived for a model without one (:mod:`sim.traces.derived`) adds ``derived`` to each group
and a top-level ``derived_from`` naming each group's origin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.bundled import bundled_dir
from sim.checks import check_int
from sim.checks import shown as _shown
from sim.errors import SimError

PROVENANCE_KEYS = ("source", "calibrated", "assumed", "fitted", "derived")
MAX_EXPERTS = 2**15 - 1  # expert ids are int16 in traces
MAX_DRIFT_DURATION = 10_000  # tokens: far past any run's context shifts (a longer excursion never ends in a run)


@dataclass(frozen=True)
class SynthDims:
    """Model dimensions a trace is generated for (neurons are per expert)."""

    n_layers: int
    n_neurons: int
    hidden: int
    n_experts: int = 1
    top_k: int = 1
    model: str = "custom"

    def __post_init__(self) -> None:
        # Neuron ids are int32 and expert ids int16 in traces; numpy integers become the ints a
        # trace file's metadata holds.
        for name in ("n_layers", "n_neurons", "hidden", "n_experts", "top_k"):
            hi = MAX_EXPERTS if name in ("n_experts", "top_k") else 2**31 - 1
            object.__setattr__(self, name, check_int(getattr(self, name), name, 1, hi))
        if self.top_k > self.n_experts:
            raise SimError(f"top_k {self.top_k} exceeds n_experts {self.n_experts}", field="top_k")
        if not isinstance(self.model, str):
            raise SimError(f"must be a model name (a string), got {_shown(self.model)}", field="model")
        object.__setattr__(self, "model", str(self.model))

    @classmethod
    def coerce(cls, dims: Any, field: str = "dims") -> SynthDims:
        """``dims`` as :class:`SynthDims`: given as such, as a model profile or as a model name or
        profile path (the model's dimensions, as ``SynthDims.from_model(load_model(dims))``)."""
        if isinstance(dims, SynthDims):
            return dims
        from sim.profiles.model import ModelProfile

        if isinstance(dims, ModelProfile | str | Path):
            from sim.profiles.registry import load_model

            try:
                return cls.from_model(load_model(dims))
            except SimError as exc:
                raise SimError(str(exc), field=field) from None
        raise SimError(f"must be SynthDims, a ModelProfile or a model name, got {_shown(dims)}", field=field)

    @classmethod
    def from_model(cls, profile: Any) -> SynthDims:
        """Dimensions of a :class:`sim.profiles.model.ModelProfile` (or anything alike)."""
        return cls(n_layers=int(profile.n_layers), n_neurons=int(profile.ffn_dim), hidden=int(profile.hidden),
                   n_experts=int(profile.n_experts), top_k=int(profile.top_k), model=str(profile.name))

    @classmethod
    def from_mapping(cls, raw: Any, source: str, where: str = "made_for") -> SynthDims:
        if not isinstance(raw, dict):
            raise SimError("must be a mapping of n_layers, n_neurons, hidden[, n_experts, top_k, model]",
                           source=source, field=where)
        allowed = {"n_layers", "n_neurons", "hidden", "n_experts", "top_k", "model"}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise SimError(f"unknown keys {unknown}; allowed: {sorted(allowed)}", source=source, field=where)
        try:
            return cls(**raw)
        except TypeError as exc:
            raise SimError(f"incomplete ({exc})", source=source, field=where) from None
        except SimError as exc:
            raise SimError(exc.detail, source=source, field=f"{where}.{exc.field}") from None

    def to_mapping(self) -> dict[str, Any]:
        return {"model": self.model, "n_layers": int(self.n_layers), "n_neurons": int(self.n_neurons),
                "hidden": int(self.hidden), "n_experts": int(self.n_experts), "top_k": int(self.top_k)}


# -- per-layer profiles -----------------------------------------------------------------------

def layer_profile(spec: Any, n_layers: int, *, source: str, where: str,
                  lo: float = -math.inf, hi: float = math.inf) -> np.ndarray:
    """Resolve a per-layer spec (number, list, or ``{at, value}`` anchors) to ``n_layers`` values."""
    if isinstance(spec, bool):
        raise SimError(f"expected a number, a list or {{at, value}}, got {spec!r}", source=source, field=where)
    if isinstance(spec, int | float):
        out = np.full(n_layers, float(spec))
    elif isinstance(spec, list):
        vals = _numbers(spec, source, where)
        out = vals if len(vals) == n_layers else np.interp(_depths(n_layers), _depths(len(vals)), vals)
    elif isinstance(spec, dict) and set(spec) == {"at", "value"}:
        at, vals = _numbers(spec["at"], source, f"{where}.at"), _numbers(spec["value"], source, f"{where}.value")
        if at.size != vals.size:
            raise SimError(f"'at' has {at.size} entries but 'value' {vals.size}", source=source, field=where)
        if np.any(at < 0) or np.any(at > 1) or np.any(np.diff(at) <= 0):
            raise SimError("'at' must be increasing relative depths in [0, 1]", source=source, field=f"{where}.at")
        out = np.interp(_depths(n_layers), at, vals)
    else:
        raise SimError(f"expected a number, a list (one per layer) or {{at: [...], value: [...]}}, got {spec!r}",
                       source=source, field=where)
    if not np.all(np.isfinite(out)) or np.any(out < lo) or np.any(out > hi):  # NaN fails no comparison
        raise SimError(f"values must be finite and lie in [{lo:g}, {hi:g}]", source=source, field=where)
    return out


def _depths(n: int) -> np.ndarray:
    return np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1)


def _numbers(raw: Any, source: str, where: str) -> np.ndarray:
    if not isinstance(raw, list) or not raw or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in raw):
        raise SimError("expected a non-empty list of numbers", source=source, field=where)
    arr = np.asarray(raw, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise SimError("values must be finite", source=source, field=where)
    return arr


# -- the parameter set ----------------------------------------------------------------------

@dataclass
class SynthParams:
    """A validated generator parameter set (see the module docstring for the fields)."""

    name: str
    raw: dict[str, Any]
    source: str = "<params>"
    made_for: SynthDims | None = None
    description: str = ""
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)

    # The resolvers below turn the raw spec into arrays for concrete dimensions.
    def density(self, dims: SynthDims) -> np.ndarray:
        return layer_profile(self.groups["density"]["value"], dims.n_layers, source=self.source,
                             where="density.value", lo=1e-6, hi=1.0)

    def persistence(self, dims: SynthDims) -> np.ndarray:
        return layer_profile(self.groups["persistence"]["value"], dims.n_layers, source=self.source,
                             where="persistence.value", lo=0.0, hi=0.999)

    def propensity_shape(self, dims: SynthDims) -> np.ndarray:
        """Logit offsets per (layer, rank), hottest first; the location is solved later."""
        spec = self.groups["propensity"]
        n, u = dims.n_neurons, (np.arange(dims.n_neurons) + 0.5) / dims.n_neurons
        if spec["dist"] == "logitnormal":
            sigma = layer_profile(spec["sigma"], dims.n_layers, source=self.source, where="propensity.sigma",
                                  lo=0.0, hi=20.0)
            z = _norm_isf(u)
            return sigma[:, None] * z[None, :]
        knots = np.asarray(spec["rank"], dtype=np.float64)
        logit = spec["logit"]
        rows = logit if isinstance(logit[0], list) else [logit]
        table = np.array([np.interp(u, knots, np.asarray(r, dtype=np.float64)) for r in rows])
        if table.shape[0] == dims.n_layers:
            return table
        src, dst = _depths(table.shape[0]), _depths(dims.n_layers)
        out = np.empty((dims.n_layers, n))
        for j in range(n):  # interpolate over depth, per rank (n columns, few layers)
            out[:, j] = np.interp(dst, src, table[:, j])
        return out

    def coactivation(self) -> tuple[int, float]:
        spec = self.groups.get("coactivation") or {}
        return int(spec.get("group_size", 0)), float(spec.get("strength", 0.0))

    def drift(self, dims: SynthDims) -> tuple[float, np.ndarray, bool, np.ndarray]:
        """Context shifts: rate per token, share re-drawn, regular spacing, static share (per layer)."""
        spec = self.groups.get("drift") or {}
        rate = float(spec.get("rate", 0.0))
        share = layer_profile(spec.get("share", 0.0), dims.n_layers, source=self.source, where="drift.share",
                              lo=0.0, hi=1.0)
        static = layer_profile(spec.get("static", 0.0), dims.n_layers, source=self.source, where="drift.static",
                               lo=0.0, hi=0.99)
        return rate, share, spec.get("spacing", "random") == "regular", static

    def drift_duration(self) -> int:
        """Tokens a context shift lasts before it is undone (0: it lasts for good)."""
        value = (self.groups.get("drift") or {}).get("duration", 0)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DRIFT_DURATION:
            raise SimError(f"must be a whole number of tokens in [0, {MAX_DRIFT_DURATION}] (0: a shift lasts for "
                           f"good), got {value!r}", source=self.source, field="drift.duration")
        return value

    def routing(self, dims: SynthDims) -> tuple[np.ndarray, np.ndarray]:
        """Expert popularity (layers, experts; rows sum to 1) and set persistence per layer."""
        spec = self.groups.get("routing") or {}
        pop_spec = spec.get("popularity", "uniform")
        n_l, n_e, k = dims.n_layers, dims.n_experts, dims.top_k
        where = "routing.popularity"
        if pop_spec == "uniform":
            pop = np.full((n_l, n_e), 1.0 / n_e)
        elif isinstance(pop_spec, list) and pop_spec and isinstance(pop_spec[0], list):
            rows = np.array([_numbers(r, self.source, where) for r in pop_spec]) \
                if len({len(r) for r in pop_spec}) == 1 else None
            if rows is None or rows.shape[1] != n_e:
                raise SimError(f"each row must list {n_e} expert shares", source=self.source, field=where)
            pop = np.array([np.interp(_depths(n_l), _depths(rows.shape[0]), rows[:, e]) for e in range(n_e)]).T
        elif isinstance(pop_spec, list):
            row = _numbers(pop_spec, self.source, where)
            if row.size != n_e:
                raise SimError(f"lists {row.size} expert shares but the model has {n_e} experts",
                               source=self.source, field=where)
            pop = np.tile(row, (n_l, 1))
        else:
            raise SimError("must be 'uniform', a list of expert shares or one such list per layer",
                           source=self.source, field=where)
        if np.any(pop < 0):
            raise SimError("expert shares must be >= 0", source=self.source, field=where)
        if np.any(pop.sum(axis=1) <= 0):
            raise SimError("expert shares must not all be 0 (in every layer some expert is routed to)",
                           source=self.source, field=where)
        pop = pop / pop.sum(axis=1, keepdims=True)
        if np.any(pop * k > 1 + 1e-9):
            raise SimError(f"with top_k={k} no expert can take more than 1/{k} of the selections",
                           source=self.source, field=where)
        pers = layer_profile(spec.get("persistence", 0.0), n_l, source=self.source, where="routing.persistence",
                             lo=0.0, hi=0.999)
        return pop, pers

    def predictor(self, dims: SynthDims) -> dict[str, np.ndarray] | None:
        spec = self.groups.get("predictor")
        if not spec:
            return None
        n_l = dims.n_layers
        out = {"recall": layer_profile(spec["recall"], n_l, source=self.source, where="predictor.recall",
                                       lo=0.0, hi=1.0)}
        if "precision" in spec:
            out["precision"] = layer_profile(spec["precision"], n_l, source=self.source,
                                             where="predictor.precision", lo=1e-6, hi=1.0)
        else:
            out["false_positive_rate"] = layer_profile(spec["false_positive_rate"], n_l, source=self.source,
                                                       where="predictor.false_positive_rate", lo=0.0, hi=1.0)
        out["fp_skew"] = np.full(n_l, float(spec.get("fp_skew", 1.0)))
        fp_pers = spec.get("fp_persistence")
        out["fp_persistence"] = (self.persistence(dims) if fp_pers is None else
                                 layer_profile(fp_pers, n_l, source=self.source, where="predictor.fp_persistence",
                                               lo=0.0, hi=0.999))
        return out

    def to_yaml(self) -> str:
        return dump_yaml(self.raw)


_GROUP_KEYS: dict[str, set[str]] = {
    "density": {"value"},
    "propensity": {"dist", "sigma", "rank", "logit"},
    "persistence": {"value"},
    "coactivation": {"group_size", "strength"},
    "drift": {"rate", "share", "spacing", "static", "duration"},
    "routing": {"popularity", "persistence"},
    "predictor": {"recall", "precision", "false_positive_rate", "fp_skew", "fp_persistence"},
}
_TOP_KEYS = {"name", "description", "made_for", "derived_from", *_GROUP_KEYS}


def params_from_mapping(raw: dict[str, Any], source: str = "<params>") -> SynthParams:
    """Validate a parameter mapping (as read from YAML) and return :class:`SynthParams`."""
    if not isinstance(raw, dict):
        raise SimError("expected a mapping of parameter groups", source=source)
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise SimError(f"unknown keys {unknown}; allowed: {sorted(_TOP_KEYS)}", source=source)
    origins = raw.get("derived_from")
    if origins is not None and not (isinstance(origins, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in origins.items())):
        raise SimError("must map parameter groups to where they came from (text)", source=source,
                       field="derived_from")
    for required in ("density", "propensity", "persistence"):
        if required not in raw:
            raise SimError("is required", source=source, field=required)
    groups: dict[str, dict[str, Any]] = {}
    for name, allowed in _GROUP_KEYS.items():
        if name not in raw or raw[name] is None:
            continue
        grp = raw[name]
        if not isinstance(grp, dict):
            raise SimError("must be a mapping", source=source, field=name)
        bad = sorted(set(grp) - allowed - set(PROVENANCE_KEYS) - {"notes"})
        if bad:
            raise SimError(f"unknown keys {bad}; allowed: {sorted(allowed | set(PROVENANCE_KEYS))}",
                           source=source, field=name)
        groups[name] = grp
    for name in ("density", "persistence"):
        if "value" not in groups[name]:
            raise SimError("needs 'value'", source=source, field=name)
    prop = groups["propensity"]
    if prop.get("dist") == "logitnormal":
        if "sigma" not in prop:
            raise SimError("logitnormal needs 'sigma'", source=source, field="propensity")
    elif prop.get("dist") == "empirical":
        knots = _numbers(prop.get("rank"), source, "propensity.rank")
        if knots[0] < 0 or knots[-1] > 1 or np.any(np.diff(knots) <= 0):
            raise SimError("must increase within [0, 1]", source=source, field="propensity.rank")
        logit = prop.get("logit")
        rows = logit if isinstance(logit, list) and logit and isinstance(logit[0], list) else [logit]
        for i, row in enumerate(rows):
            vals = _numbers(row, source, f"propensity.logit[{i}]")
            if vals.size != knots.size:
                raise SimError(f"has {vals.size} values but 'rank' has {knots.size}", source=source,
                               field=f"propensity.logit[{i}]")
            if np.any(np.diff(vals) > 1e-9):
                raise SimError("must not increase with rank (hottest first)", source=source,
                               field=f"propensity.logit[{i}]")
    else:
        raise SimError(f"dist must be 'logitnormal' or 'empirical', got {prop.get('dist')!r}", source=source,
                       field="propensity.dist")
    co = groups.get("coactivation")
    if co:
        gs, st = co.get("group_size", 0), co.get("strength", 0.0)
        if not isinstance(gs, int) or isinstance(gs, bool) or gs < 0 or gs == 1:
            raise SimError("group_size must be 0 (off) or an integer >= 2", source=source,
                           field="coactivation.group_size")
        if not isinstance(st, int | float) or isinstance(st, bool) or not 0 <= st <= 1:
            raise SimError("strength must be in [0, 1]", source=source, field="coactivation.strength")
    drift = groups.get("drift")
    if drift:
        rate = drift.get("rate", 0.0)
        if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 <= rate < 1:
            raise SimError("must be a probability per token in [0, 1)", source=source, field="drift.rate")
        if rate > 0 and "share" not in drift:
            raise SimError("needs 'share' (the fraction of a layer's neurons a context shift re-draws)",
                           source=source, field="drift")
        if drift.get("spacing", "random") not in ("random", "regular"):
            raise SimError(f"must be 'random' (each token w.p. rate) or 'regular' (one shift per 1/rate tokens), "
                           f"got {drift.get('spacing')!r}", source=source, field="drift.spacing")
    pred = groups.get("predictor")
    if pred:
        if "recall" not in pred:
            raise SimError("needs 'recall'", source=source, field="predictor")
        if ("precision" in pred) == ("false_positive_rate" in pred):
            raise SimError("give exactly one of 'precision' or 'false_positive_rate'", source=source,
                           field="predictor")
        skew = pred.get("fp_skew", 1.0)
        if not isinstance(skew, int | float) or isinstance(skew, bool) or not 0 <= skew <= 4:
            raise SimError("must be a number in [0, 4]", source=source, field="predictor.fp_skew")
    made_for = SynthDims.from_mapping(raw["made_for"], source) if raw.get("made_for") is not None else None
    params = SynthParams(name=str(raw.get("name", Path(source).stem)), raw=raw, source=source, made_for=made_for,
                         description=str(raw.get("description", "")), groups=groups)
    # Resolve once at the made-for (or a small) size so errors surface at load time.
    probe = made_for or SynthDims(n_layers=4, n_neurons=64, hidden=64)
    params.density(probe)
    params.persistence(probe)
    params.propensity_shape(SynthDims(probe.n_layers, 64, probe.hidden, probe.n_experts, probe.top_k))
    if probe.n_experts > 1:
        params.routing(probe)
    params.predictor(probe)
    params.drift(probe)
    params.drift_duration()
    return params


def load_params(path: str | Path) -> SynthParams:
    """Read a parameter file (YAML) written by ``sim trace fit`` or by hand."""
    from sim.profiles.yamlio import load_yaml_file

    path = Path(path)
    return params_from_mapping(load_yaml_file(path), str(path))


PRESET_DIR = bundled_dir("trace_presets")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> SynthParams:
    """A bundled preset by name (``trace_presets/<name>.yaml``)."""
    names = preset_names()
    if name not in names:
        raise SimError(f"unknown preset {name!r}; bundled presets: {', '.join(names)}", field="--preset")
    return load_params(PRESET_DIR / f"{name}.yaml")


def resolve_params(ref: str | Path | SynthParams) -> SynthParams:
    """A preset name, a YAML path, or an already loaded parameter set."""
    if isinstance(ref, SynthParams):
        return ref
    if not isinstance(ref, str | Path):
        raise SimError(f"must be a preset name, a parameter file path or SynthParams, got {_shown(ref)}",
                       field="params")
    text = str(ref)
    if text in preset_names():
        return load_preset(text)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        return load_params(text)
    raise SimError(f"unknown preset {text!r}; bundled presets: {', '.join(preset_names())}", field="--preset")


def dump_yaml(raw: dict[str, Any]) -> str:
    """YAML with short lists inline, so per-layer and per-knot lists stay readable."""

    class _Dumper(yaml.SafeDumper):
        pass

    def _list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
        flow = all(not isinstance(v, dict | list) for v in data) or all(isinstance(v, list) for v in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow and len(data) < 400)

    _Dumper.add_representer(list, _list)
    return yaml.dump(raw, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


# -- the standard normal inverse survival function, without scipy --------------------------

def _norm_isf(u: np.ndarray) -> np.ndarray:
    """z with P(Z > z) = u, vectorised (Acklam's rational approximation + one Newton step)."""
    p = 1.0 - np.asarray(u, dtype=np.float64)
    a = [-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00]
    b = [-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01]
    c = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00]
    out = np.empty_like(p)
    lo, hi = p < 0.02425, p > 1 - 0.02425
    mid = ~(lo | hi)
    q = np.sqrt(-2 * np.log(p[lo]))
    out[lo] = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    q = np.sqrt(-2 * np.log(1 - p[hi]))
    out[hi] = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    q = p[mid] - 0.5
    r = q * q
    out[mid] = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    # One Halley refinement using erfc from math (vectorised through np.vectorize is slow; use erf).
    cdf = 0.5 * (1.0 + _erf(out / math.sqrt(2.0)))
    e = cdf - p
    g = e * math.sqrt(2 * math.pi) * np.exp(out * out / 2)
    return out - g / (1 + out * g / 2)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)
