"""``--set key=value``: strategy knobs and profile fields edited by their path, for any command.

A key ``device.<field path>`` or ``model.<field path>`` (``:scale`` to multiply) edits the
profile as a sweep axis does (a run's ``RunConfig.overrides``, applied by
:func:`sim.profiles.edits.apply_overrides`); other keys are strategy knobs, for the
commands that take them.
"""

from __future__ import annotations

from typing import Any

from sim.checks import shown
from sim.errors import SimError
from sim.profiles.edits import PROFILE_PREFIXES


def parse_sets(values: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``--set key=value`` pairs in command-line order: (values parsed as YAML, the text as typed).

    A key given twice is an error (which one should win is a guess; with ``:scale`` the
    order would matter). ``knobs.NAME`` is a knob, spelt as in a sweep spec.
    """
    from sim.profiles.yamlio import load_yaml_value

    sets: dict[str, Any] = {}
    texts: dict[str, str] = {}
    for item in values:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise SimError(f"expected key=value, got {shown(item)}", field="--set")
        if key.startswith("knobs."):
            key = key.removeprefix("knobs.")
            if not key or key.startswith(PROFILE_PREFIXES) or "." in key:
                raise SimError("knobs.<name> takes a knob's name (no dots); a profile field is device.<path> "
                               "or model.<path>", field=f"--set knobs.{key}")
        if key in sets:
            raise SimError(f"given twice ({texts[key]!r}, then {raw!r}); give each key once", field=f"--set {key}")
        try:
            sets[key] = load_yaml_value(raw, f"--set {key}") if raw.strip() else None
        except SimError as exc:
            raise SimError(f"cannot parse value {shown(raw)} ({exc.detail})", field=f"--set {key}") from None
        texts[key] = raw
    return sets, texts


def profile_sets(sets: dict[str, Any], flag: str = "--set") -> dict[str, Any]:
    """The profile edits among ``sets``; a command without strategy knobs refuses the rest."""
    for key in sets:
        if not key.startswith(PROFILE_PREFIXES):
            raise SimError("this command takes profile fields only (device.<path>=value or model.<path>=value)",
                           field=f"{flag} {key}")
    return sets


def own_preset(model: str, overrides: dict[str, Any], trace: Any, preset: str | None) -> str | None:
    """The preset to ask for: a model renamed by ``--set model.name`` keeps its own activations
    (the preset named after the base model), not whatever preset the new name happens to match."""
    if "model.name" in overrides and trace is None and preset is None:
        from sim.profiles.registry import load_model

        return load_model(model).name
    return preset
