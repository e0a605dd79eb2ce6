"""The trace preset of any model: its bundled one, or one derived from the closest bundled preset.

A run needs activation statistics for its model, but only a few models have a preset of
their own (``trace_presets/<model>.yaml``). Rather than refuse the others, or copy a
preset per model by hand, a model without one gets a *derived* preset:

- **density** from its own profile (``sparsity.per_layer`` or ``mean_active_fraction``):
  that is the one published (or stated as assumed) figure the profile has;
- **locality** (propensity skew, persistence, drift, co-activation) and the **predictor**
  from the closest bundled preset of the same activation class. A ReLU-family activation
  (relu, relu2, fatrelu, drelu) is exactly sparse and its active set is what the model
  computes; a smooth one (silu, gelu) is sparse only after a magnitude threshold, which
  gives a far flatter popularity curve (see the mistral-7b preset). Within a class the
  closest preset is the same model family first, then the same MoE-ness, FFN layout,
  activation and the nearest density;
- **routing** (a mixture-of-experts model) from the closest MoE preset, of the same family
  if there is one (the locality source itself when it is a MoE preset).

Every derived group keeps the provenance of what it was copied from and adds ``derived``
saying where from; ``derived_from`` names the origin of the density, the locality
(propensity, persistence, drift, co-activation), the predictor and the routing. Locality parameters
are per layer and per token, never per neuron id (:mod:`sim.traces.params`), which is what
lets them move between widths; that they also move between models of one class is the
assumption a derived preset makes, and says.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from sim.errors import SimError
from sim.profiles.model import ModelProfile
from sim.profiles.registry import bundled_names, load_model
from sim.traces import params as _params
from sim.traces.params import SynthDims, SynthParams, params_from_mapping

EXACT_ACTIVATIONS = frozenset({"relu", "relu2", "fatrelu", "drelu"})
# copied from the locality source ("locality" in derived_from: all but the predictor)
LOCALITY_GROUPS = ("propensity", "persistence", "drift", "coactivation", "predictor")


def activation_class(activation: str) -> str:
    """``exact`` (ReLU family: inactive means exactly zero) or ``thresholded`` (smooth: SiLU, GELU)."""
    return "exact" if activation in EXACT_ACTIVATIONS else "thresholded"


def preset_for(name: str | None, model: ModelProfile | None = None, *, hint: str = "",
               field: str = "--preset") -> SynthParams:
    """The preset called ``name`` (default: ``model``'s name): a bundled file, else a derived one.

    A name that is not a bundled preset is derived for ``model`` when it is that model's name,
    else for the bundled model profile of that name; anything else is a one-line error
    listing what exists (``hint`` is appended, e.g. ``(or pass --trace FILE)``).
    """
    if name is None:
        if model is None:
            raise SimError("needs a preset name or a model", field="--preset")
        name = model.name
    if name in _params.preset_names():
        return _params.load_preset(name)
    if model is not None and model.name == name:
        return derive_preset(model)
    if name in bundled_names("model"):
        return derive_preset(load_model(name))
    known = ", ".join(_params.preset_names())
    raise SimError(f"no synthetic-trace preset {name!r}; presets: {known}; or any bundled model's name, "
                   f"for a derived one{' ' + hint if hint else ''}", field=field)


def derive_preset(model: ModelProfile) -> SynthParams:
    """A preset for ``model`` from its profile's sparsity and the closest bundled presets."""
    sources = _bundled_sources()
    cls = activation_class(model.activation)
    same_class = [s for s in sources if activation_class(s["model"].activation) == cls]
    if not same_class:
        raise SimError(f"no bundled trace preset of a {cls} activation to derive {model.name}'s from; pass "
                       "--preset NAME or --trace FILE", field="--preset")
    density = _density(model)
    local = min(same_class, key=lambda s: _distance(s, model, density))
    why = _why(local["model"], model)
    raw: dict[str, Any] = {
        "name": model.name,
        "description": f"derived for {model.name}: density from its model profile, locality from the "
                       f"{local['name']} preset",
        "made_for": SynthDims.from_model(model).to_mapping(),
        "derived_from": {"density": f"model profile {model.name}", "locality": f"preset {local['name']}",
                         **({"predictor": f"preset {local['name']}"} if "predictor" in local["raw"] else {})},
    }
    spread = model.sparsity.per_layer
    raw["density"] = {"value": list(spread) if spread else float(model.sparsity.mean_active_fraction),
                      "derived": f"model profile {model.name}: sparsity."
                                 f"{'per_layer' if spread else 'mean_active_fraction'} "
                                 f"({model.sparsity.source})"}
    if not spread:
        raw["density"]["assumed"] = "the same density in every layer (the profile gives no per-layer figure)"
    for group in LOCALITY_GROUPS:
        if group in local["raw"]:
            raw[group] = {**copy.deepcopy(local["raw"][group]),
                          "derived": f"as the {local['name']} preset ({why}): per-layer, per-token statistics "
                                     f"assumed to carry over within the {cls} activation class"}
    if model.n_experts > 1:
        raw["routing"], raw["derived_from"]["routing"] = _routing(model, local, sources)
    return params_from_mapping(raw, f"derived preset {model.name}")


def derived_from(params: SynthParams) -> dict[str, str] | None:
    """Where each group of a derived preset came from (None for a preset that is not derived)."""
    got = params.raw.get("derived_from")
    return dict(got) if isinstance(got, dict) else None


def catalogue() -> list[dict[str, Any]]:
    """Every preset a run can use by name: the bundled files and one derived per model without one."""
    rows = []
    bundled = set(_params.preset_names())
    for name in sorted(bundled | set(bundled_names("model"))):
        params = preset_for(name)
        made_for = params.made_for
        rows.append({"name": name, "kind": "bundled" if name in bundled else "derived",
                     "density": round(float(params.density(made_for).mean()), 4) if made_for else None,
                     "description": params.description, "derived_from": derived_from(params)})
    return rows


# -- how close a bundled preset is -------------------------------------------------------------

def _bundled_sources() -> list[dict[str, Any]]:
    """Each bundled preset with its model profile (a preset without a bundled profile is skipped:
    nothing says what activation it describes)."""
    models = set(bundled_names("model"))
    out = []
    for name in _params.preset_names():
        if name not in models:
            continue
        params = _params.load_preset(name)
        out.append({"name": name, "model": load_model(name), "raw": params.raw,
                    "density": float(params.density(params.made_for or SynthDims(1, 1, 1)).mean())})
    return out


def _density(model: ModelProfile) -> float:
    spread = model.sparsity.per_layer
    return float(sum(spread) / len(spread)) if spread else float(model.sparsity.mean_active_fraction)


def _distance(source: dict[str, Any], model: ModelProfile, density: float) -> tuple:
    """Lexicographic: family, MoE-ness, FFN layout, activation, |log density ratio|, then name."""
    other: ModelProfile = source["model"]
    return (other.family != model.family, (other.n_experts > 1) != (model.n_experts > 1),
            other.ffn_gated != model.ffn_gated, other.activation != model.activation,
            abs(math.log(source["density"] / density)), source["name"])


def _why(other: ModelProfile, model: ModelProfile) -> str:
    same = [w for w, ok in (("family", other.family == model.family),
                            ("activation", other.activation == model.activation),
                            ("FFN layout", other.ffn_gated == model.ffn_gated)) if ok]
    return f"the closest bundled {activation_class(model.activation)}-activation preset" + (
        f"; same {' and '.join(same)}" if same else "")


def _routing(model: ModelProfile, local: dict[str, Any], sources: list[dict[str, Any]]) -> tuple[dict, str]:
    """Routing for a MoE model: from the locality source if it is MoE, else the closest MoE preset."""
    moe = [s for s in sources if "routing" in s["raw"] and s["model"].n_experts > 1]
    if "routing" in local["raw"]:
        moe = [local]
    if not moe:
        return ({"popularity": "uniform", "persistence": 0.0,
                 "assumed": "no bundled MoE preset to derive routing from: uniform experts, chosen afresh "
                            "each token"}, "assumed")
    src = min(moe, key=lambda s: (s["model"].family != model.family, s["model"].n_experts != model.n_experts,
                                  s["model"].top_k != model.top_k, s["name"]))
    routing = copy.deepcopy(src["raw"]["routing"])
    note = f"as the {src['name']} preset (the closest bundled MoE preset"
    note += f", same family {model.family})" if src["model"].family == model.family else ")"
    if routing.get("popularity", "uniform") != "uniform" and src["model"].n_experts != model.n_experts:
        routing["popularity"] = "uniform"
        note += f"; popularity uniform ({src['name']} has {src['model'].n_experts} experts, this model " \
                f"{model.n_experts})"
    routing["derived"] = note
    return routing, f"preset {src['name']}"


def origins_text(origins: dict[str, str]) -> str:
    """``derived_from`` as one line, the groups of each origin together."""
    by_origin: dict[str, list[str]] = {}
    for group, origin in origins.items():
        by_origin.setdefault(origin, []).append(group)
    return "; ".join(f"{', '.join(groups)} from {origin}" for origin, groups in by_origin.items())


def describe(params: SynthParams) -> str:
    """One line for a command's output: which preset, and for a derived one where it came from."""
    origins = derived_from(params)
    if origins is None:
        return f"preset {params.name} ({Path(params.source).name})"
    return f"derived preset {params.name}: {origins_text(origins)}"
