"""``--set key=value``: strategy knobs and profile fields edited by their path, for any command.

A key ``device.<field path>`` or ``model.<field path>`` (``:scale`` to multiply) edits the
profile as a sweep axis does (:func:`sim.explore.resolve.profile_with_overrides`); other
keys are strategy knobs, for the commands that take them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.errors import SimError

PROFILE_PREFIXES = ("device.", "model.")


def parse_sets(values: list[str]) -> dict[str, Any]:
    """``--set key=value`` pairs, in order; values are parsed as YAML (scalars, lists, mappings)."""
    from sim.profiles.yamlio import load_yaml_value

    sets: dict[str, Any] = {}
    for item in values:
        if "=" not in item:
            raise SimError(f"expected key=value, got {item!r}", field="--set")
        key, raw = item.split("=", 1)
        key = key.strip().removeprefix("knobs.")  # a sweep spec's spelling of a knob works here too
        if not key:
            raise SimError(f"expected key=value, got {item!r}", field="--set")
        try:
            sets[key] = load_yaml_value(raw, f"--set {key}") if raw.strip() else None
        except SimError as exc:
            raise SimError(f"cannot parse value {raw!r} ({exc.detail})", field=f"--set {key}") from None
    return sets


def with_overrides(kind: str, ref: str, sets: dict[str, Any]) -> Any:
    """``ref`` itself, or the profile with the ``--set device.<path>=value`` (``model.``) overrides
    applied and validated: the sweep's profile axes, for one run."""
    from sim.explore.resolve import Resolver, SettingError, profile_with_overrides

    overrides = [(key, value) for key, value in sets.items() if key.startswith(f"{kind}.")]
    if not overrides:
        return ref
    try:
        return profile_with_overrides(kind, ref, overrides, Resolver(Path.cwd(), "--set"), " with --set overrides")
    except SettingError as exc:
        if exc.key == kind:  # the profile itself, before any override
            raise SimError(exc.detail, source=exc.source, field=exc.field or f"--{kind}") from None
        raise SimError(exc.detail, field=f"--set {exc.key}") from None


def profile_sets(sets: dict[str, Any], flag: str = "--set") -> dict[str, Any]:
    """The profile edits among ``sets``; a command without strategy knobs refuses the rest."""
    for key in sets:
        if not key.startswith(PROFILE_PREFIXES):
            raise SimError("this command takes profile fields only (device.<path>=value or model.<path>=value)",
                           field=f"{flag} {key}")
    return sets
