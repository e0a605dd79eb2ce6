"""Profile edits by field path: one mechanism for sweep axes, ``--set`` and the library.

``storage.seq_read.*.gbps`` walks mappings by key and lists by index, by ``*`` (every
entry) or by an entry's ``name`` (``cpu.clusters.big.cores``); the field(s) reached are set
or, with a ``:scale`` suffix on the key, multiplied. The edited profile is validated as a
file would be; an edit of a field the simulation never reads (see
:func:`sim.profiles.schema.documentary_path`), or two edits of one field, are refused;
an error names the edit to blame (:class:`SettingError`). Errors in a path name the place
it went wrong.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel

from sim.checks import shown
from sim.errors import SimError
from sim.profiles.schema import documentary_path, validate

if TYPE_CHECKING:
    from sim.profiles.device import DeviceProfile
    from sim.profiles.model import ModelProfile

SCALE_SUFFIX = ":scale"
PROFILE_KINDS = ("device", "model")
PROFILE_PREFIXES = ("device.", "model.")  # an edit's key: the profile it edits, then the field path

# The source of a SimError for a path that names no field: a spec error, not a failed point.
PATH_ERROR = "<unknown field path>"


def apply_path(data: dict[str, Any], path: str, value: Any, *, scale: bool = False, where: str = "") -> list[str]:
    """Set (or multiply, with ``scale``) the field(s) at ``path`` in a profile's dumped data.

    Returns the concrete paths it changed (``cpu.clusters.0.cores`` for ``cpu.clusters.big.cores``),
    so an error found later by validation can be traced to the edit that made it.
    """
    steps = path.split(".")
    targets: list[tuple[Any, Any, str]] = []
    _walk(data, steps, [], targets, where)
    for parent, key, _ in targets:
        if scale:
            parent[key] = _scaled(parent[key], value, where)
        else:
            try:
                parent[key] = copy.deepcopy(plain(value))
            except Exception:  # a generator, a lock: not a value a profile field can hold
                raise SimError(f"cannot use a {type(value).__name__} as a profile value", field=where) from None
    return [concrete for _, _, concrete in targets]


def plain(value: Any) -> Any:
    """numpy scalars as the Python numbers they are, inside lists and mappings too (a script
    looping over ``np.arange`` edits with them); anything else unchanged."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _scaled(current: Any, factor: Any, where: str) -> int | float:
    """``current * factor``. A whole product of an integer stays an integer; any other stays a
    float, so an integer field (cores, layers) refuses 2.5 instead of rounding it silently,
    while a byte count (which may be fractional before rounding) and a float field keep it."""
    factor = plain(factor)
    if isinstance(current, bool) or not isinstance(current, int | float):
        raise SimError(f"cannot scale a non-numeric field (value {shown(current)})", field=where)
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        raise SimError(f"a :scale value must be a number, got {shown(factor)}", field=where)
    try:
        product = float(current) * float(factor)
    except OverflowError:
        product = math.inf
    if not math.isfinite(product):
        raise SimError(f"scaling {shown(current)} by {shown(factor)} gives {product}; the result must be a "
                       "finite number", field=where)
    if isinstance(current, int) and abs(product - round(product)) <= 1e-9 * max(1.0, abs(product)):
        return int(round(product))
    return product


def _walk(node: Any, steps: list[str], done: list[str], out: list[tuple[Any, Any, str]], where: str) -> None:
    step, rest = steps[0], steps[1:]
    here = ".".join(done) or "(top level)"
    if isinstance(node, dict):
        if step not in node:
            raise SimError(f"no field {step!r} at {here}; fields there: {', '.join(sorted(node))}",
                           source=PATH_ERROR, field=where)
        keys: list[Any] = [step]
    elif isinstance(node, list):
        if step == "*":
            keys = list(range(len(node)))
            if not keys:
                raise SimError(f"* matches no entry: {here} is an empty list", field=where)
        elif re.fullmatch(r"-?[0-9]+", step):
            i = int(step)
            if not -len(node) <= i < len(node):
                raise SimError(f"index {i} is out of range at {here} ({len(node)} entries)", field=where)
            keys = [i % len(node)]  # -1 is the last entry: one spelling, so two edits of it are seen
        else:
            keys = [i for i, item in enumerate(node) if isinstance(item, dict) and item.get("name") == step]
            if not keys:
                names = [str(item.get("name")) for item in node if isinstance(item, dict) and "name" in item]
                raise SimError(f"no entry named {step!r} at {here}; use an index, * or one of: "
                               f"{', '.join(names) or '(no named entries)'}", field=where)
    else:
        raise SimError(f"{here} is {node!r}, not a section; cannot go into {step!r}", field=where)
    for key in keys:
        if rest:
            _walk(node[key], rest, [*done, str(key)], out, where)
        else:
            out.append((node, key, ".".join([*done, str(key)])))


class SettingError(SimError):
    """A point's settings do not resolve, and ``key`` is the setting to blame.

    The key (``memory_budget``, ``knobs.hot_share``, ``device.storage.rand_read.*.gbps:scale``
    ...) lets the sweep name the spec field to fix (``grid.memory_budget``) instead of an
    engine option the user never typed.
    """

    def __init__(self, exc: SimError, key: str):
        super().__init__(exc.detail, source=exc.source, field=exc.field)
        self.key = key


@contextlib.contextmanager
def blame(key: str) -> Iterator[None]:
    """Tag a SimError raised inside the block with the setting that caused it."""
    try:
        yield
    except SettingError:
        raise
    except SimError as exc:
        raise SettingError(exc, key) from None


def edited_profile(kind: str, data: dict[str, Any], overrides: list[tuple[str, Any]], suffix: str) -> BaseModel:
    """Profile ``kind`` from its dumped ``data`` (edited in place: pass a fresh dump) with
    ``overrides`` applied in order.

    Each override is ``(key, value)`` with ``key`` ``device.<field path>`` (or ``model.``),
    ending in ``:scale`` to multiply the field(s) instead of setting them. The result is
    validated as a file would be, so an override cannot produce a profile a file could
    not; a SettingError names the override (or ``kind``, for the profile itself) to blame.
    """
    from sim.profiles.device import DeviceProfile
    from sim.profiles.model import ModelProfile

    cls = DeviceProfile if kind == "device" else ModelProfile
    touched: list[tuple[str, list[str]]] = []  # each override with the concrete fields it changed
    for key, value in overrides:
        path = key.split(".", 1)[1]
        scale = path.endswith(SCALE_SUFFIX)
        if scale:
            path = path[: -len(SCALE_SUFFIX)]
        with blame(key):
            label = documentary_path(cls, path.split("."))
            if label is not None:
                raise SimError(f"{kind}.{label[0]} is not read by the simulation, so editing it would change no "
                               f"result: it is {label[1]}", field=key)
            original_name = data.get("name")
            changed = apply_path(data, path, value, scale=scale, where=key)
            _refuse_borrowed_name(kind, original_name, data.get("name"))
            _refuse_overlap(key, changed, touched)
            touched.append((key, changed))
    name = data.get("name", kind)
    try:
        return validate(cls, data, f"{kind} {name}{suffix}")
    except SimError as exc:
        key, inner = _override_for(kind, exc, touched)
        if inner:  # the edit set a whole section: say which field in it is wrong
            exc = SimError(f"{inner}: {exc.detail}", source=exc.source, field=exc.field)
        raise SettingError(exc, key) from None


def apply_overrides(kind: str, ref: Any, overrides: Mapping[str, Any],
                    suffix: str = " with --set overrides") -> Any:
    """``ref`` (a name, a YAML path or a profile) with the edits of ``overrides`` whose keys are
    ``<kind>.<field path>``, in order: a run's profile edits (``RunConfig.overrides``, ``sim run
    --set device.<path>=VALUE``). Without such an edit ``ref`` itself comes back (a name stays a
    name). A bad edit is a SimError naming it as ``--set KEY``; a profile that does not load,
    the registry's own error."""
    from sim.profiles.registry import load_device, load_model

    edits = [(key, value) for key, value in overrides.items() if key.startswith(f"{kind}.")]
    if not edits:
        return ref
    try:
        with blame(kind):
            profile = load_device(ref) if kind == "device" else load_model(ref)
        return edited_profile(kind, profile.model_dump(mode="json"), edits, suffix)
    except SettingError as exc:
        if exc.key == kind:  # the profile itself, before any edit
            raise SimError(exc.detail, source=exc.source, field=exc.field or f"--{kind}") from None
        raise SimError(exc.detail, field=f"--set {exc.key}") from None


def _refuse_borrowed_name(kind: str, before: Any, after: Any) -> None:
    """A renamed profile labels a variant (``my-phone``); taking another bundled profile's
    name would print that phone (or model) over figures of this one."""
    from sim.profiles.registry import bundled_names

    if after != before and isinstance(after, str) and after in bundled_names(kind):
        raise SimError(f"{after!r} is another bundled {kind}: the results would carry its name but be "
                       f"{before}'s; use --{kind} {after} to simulate it, or a name of your own for the variant")


def edit_device(device: Any, edits: Mapping[str, Any]) -> DeviceProfile:
    """A device profile with ``edits`` applied: a what-if in Python, as ``sim run --set
    device.<path>=value`` is on the command line, and the profile is not changed.

    ``device``: a name, a YAML path, a profile or its mapping. ``edits`` maps field paths
    (without the ``device.`` prefix) to values. A path walks mappings by key and lists by
    index (``-1`` is the last), by ``*`` (every entry) or by an entry's ``name``; a path
    ending in ``:scale`` multiplies the field(s) instead of setting them::

        phone = sim.edit_device("oneplus-12", {"cpu.clusters.big.cores": 3,
                                               "storage.rand_read.*.gbps:scale": 0.5})
        sim.simulate(phone, "turbosparse-mixtral-47b")

    The result is validated as a YAML file would be. Refused, as ``sim.SimError`` naming
    the edit: a field the simulation never reads (labels, citations, published figures), two
    edits of one field, an integer field scaled to a fraction, any value the schema refuses.
    """
    from sim.profiles.registry import load_device

    return _edit("device", load_device(device), edits)  # type: ignore[return-value]


def edit_model(model: Any, edits: Mapping[str, Any]) -> ModelProfile:
    """A model profile with ``edits`` applied, as :func:`edit_device` does for a device (paths
    without the ``model.`` prefix, e.g. ``{"predictor.rank": 512, "n_layers:scale": 0.5}``)."""
    from sim.profiles.registry import load_model

    return _edit("model", load_model(model), edits)  # type: ignore[return-value]


def _edit(kind: str, profile: BaseModel, edits: Mapping[str, Any]) -> BaseModel:
    if not isinstance(edits, Mapping) or not all(isinstance(k, str) and k for k in edits):
        raise SimError(f"must be a mapping of field paths to values, got {shown(edits)}", field="edits")
    for key in edits:
        if key.startswith(f"{kind}."):
            raise SimError(f"give the path without the {kind}. prefix ({shown(key.split('.', 1)[1])})",
                           field=f"edits[{shown(key)}]")
    try:
        return edited_profile(kind, profile.model_dump(mode="json"),
                              [(f"{kind}.{key}", value) for key, value in edits.items()], " with edits")
    except SettingError as exc:
        detail = exc.detail.replace(f"which {kind}.", "which ")  # the edits as the caller spelt them
        raise SimError(detail, source=exc.source if exc.key == kind else None,
                       field=exc.field if exc.key == kind else f"edits[{shown(exc.key.split('.', 1)[1])}]") from None


def _refuse_overlap(key: str, changed: list[str], touched: list[tuple[str, list[str]]]) -> None:
    """Two edits of one field (a cluster by name and by index, a value and its :scale, a
    section and a field in it) would make the result depend on their order: an error."""
    for earlier, paths in touched:
        for a in changed:
            for b in paths:
                sa, sb = a.split("."), b.split(".")
                if sa[:len(sb)] == sb or sb[:len(sa)] == sa:
                    raise SimError(f"changes {a}, which {earlier} changes too; give one edit per field",
                                   field=key)


def _override_for(kind: str, exc: SimError, touched: list[tuple[str, list[str]]]) -> tuple[str, str]:
    """The override behind a validation error of the edited profile, and the part of the error's
    field path below what that override set ("" when it set the field itself).

    In order: the last override that set the error's field or a section holding it; among
    those that changed something inside the error's section (a check across its fields,
    such as usable_bytes above total_bytes), the last whose field the message names, else
    the last; the last whose field path the message names; a lone override; else the
    profile as a whole (``kind``).
    """
    got = [s for s in (exc.field or "").split(".") if s and s != "(top level)"]
    inside: list[tuple[str, str]] = []  # (key, concrete path) of edits below the error's section
    for key, paths in reversed(touched):
        for concrete in paths:
            steps = concrete.split(".")
            if len(steps) <= len(got) and got[:len(steps)] == steps:
                return key, ".".join(got[len(steps):])
            if steps[:len(got)] == got:
                inside.append((key, concrete))
    tokens = re.findall(r"[\w.]+", exc.detail)
    words = set(tokens) | {part for token in tokens for part in token.split(".")}
    named = [key for key, path in inside if path in tokens]  # a field the message names in full
    named += [key for key, path in inside if path.rsplit(".", 1)[-1] in words]  # ... or by its last name
    if named or inside:
        return (named or [key for key, _ in inside])[0], ""
    for key, paths in reversed(touched):
        if any(concrete in words for concrete in paths):
            return key, ""
    return (touched[0][0], "") if len(touched) == 1 else (kind, "")
