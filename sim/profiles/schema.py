"""Turn pydantic validation failures into the project's one-line errors.

Pydantic reports every problem as a multi-line block; users editing a YAML profile need
the first problem, its dotted field path and what is allowed, on one line.
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from sim.errors import SimError
from sim.units import parse_bytes

M = TypeVar("M", bound=BaseModel)

# The least a throughput, bandwidth or speed factor may be: any positive float passes `gt=0`,
# and a denormal one (1e-320 GB/s) divides to infinity in the engine. 1e-6 is far below any
# real figure (1 KB/s, a millionth of the measured speed).
MIN_RATE = 1e-6


class Strict(BaseModel):
    """Base for profile sections: unknown keys are errors (they are usually typos)."""

    # strict: `cores: true` or `cores: "4"` is a wrong type, not 1 or 4; allow_inf_nan=False:
    # `.inf` and `.nan` are YAML floats but never a valid bandwidth, size or rate.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)


def documentary(why: str, default: Any = ..., **constraints: Any) -> Any:
    """A field the simulation never reads (a label, or a published figure kept for reference):
    editing it changes no result, so a what-if that edits it is refused (see
    :func:`documentary_path`) instead of silently reproducing the unedited run."""
    return Field(default, json_schema_extra={"documentary": why}, **constraints)


def documentary_path(model: type[BaseModel], path: list[str]) -> tuple[str, str] | None:
    """(the documentary field on ``path`` through ``model``'s schema, why it is one), or None.

    A step into a list (an index, ``*`` or an entry's name) passes through to the entry type.
    """
    current: Any = model
    walked: list[str] = []
    for step in path:
        current = _optional(current) or current
        walked.append(step)
        if get_origin(current) is list:
            current = get_args(current)[0]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or step not in current.model_fields:
            return None
        info = current.model_fields[step]
        extra = info.json_schema_extra
        why = extra.get("documentary") if isinstance(extra, dict) else None
        if why:
            return ".".join(walked), str(why)
        current = info.annotation
    return None


def _optional(annotation: Any) -> Any:
    """``X`` for ``X | None``, else None."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        return args[0]
    return None


def _bytes(value: Any) -> int:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        try:
            return parse_bytes(value)
        except SimError as exc:
            raise ValueError(exc.detail) from None
    raise ValueError(f"expected a size such as 12GB or 512KiB, got {value!r}")


ByteSize = Annotated[int, BeforeValidator(_bytes)]
"""Bytes, written in YAML as ``24GB``, ``512KiB`` or a plain integer."""


_TYPE_TAGS = {"int", "float", "str", "bool", "list", "dict", "tuple", "none"}


def _union_branch(part: Any) -> bool:
    """A location part pydantic adds for the member of a union it tried (``float``,
    ``list[float]``, ``function-after[...]``): no field the user wrote."""
    text = str(part)
    return text in _TYPE_TAGS or ("[" in text and text.endswith("]"))


def _fields_at(model: Any, loc: tuple) -> list[str] | None:
    """The field names a (nested) pydantic model accepts at ``loc``, if they can be told."""
    import typing

    from pydantic import BaseModel

    current: Any = model
    for key in loc:
        if isinstance(key, int) or _union_branch(key):  # a list entry or a union member: unwrapped already
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or key not in current.model_fields:
            return None
        annotation: Any = current.model_fields[key].annotation
        for _ in range(4):  # Optional[...], list[...], Annotated[...]: the model inside, if one
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                break
            inner = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
            if inner:
                annotation = inner[0]
                break
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return None
            annotation = args[0]
        current = annotation
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [name for name, f in current.model_fields.items() if not f.exclude]
    return None


def _describe(err: dict[str, Any], model: Any = None) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    got = err.get("input")
    got_text = repr(got) if not isinstance(got, dict | list) else type(got).__name__
    if len(got_text) > 60:
        got_text = got_text[:57] + "..."
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        allowed = _fields_at(model, tuple(err.get("loc", ()))[:-1]) if model is not None else None
        if allowed:
            return f"unknown field (typo?); allowed here: {', '.join(allowed)}"
        return "unknown field (typo?); remove it or check the schema with `sim profiles schema`"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}[kind]
        bound = next(iter(ctx.values())) if ctx else "?"
        return f"must be {op} {bound}, got {got_text}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '?')}, got {got_text}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        want = kind.replace("_parsing", "").replace("_type", "")
        want = {"model": "mapping of fields", "dict": "mapping", "int": "integer"}.get(want, want)
        return f"must be {'an' if want[0] in 'aeiou' else 'a'} {want}, got {got_text}"
    msg = str(err.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if "got " in msg or isinstance(got, dict | list):  # a cross-field rule names its values itself
        return msg
    return f"{msg} (got {got_text})"


def validate(model: type[M], data: Any, source: str) -> M:
    """Validate ``data`` against ``model``; raise a one-line SimError on the first problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key shows up as "unknown" plus "missing"; the unknown one names the typo.
        err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
        path = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__" and not _union_branch(p)) \
            or "(top level)"
        more = len(exc.errors()) - 1
        suffix = f" (+{more} more problem{'s' if more > 1 else ''})" if more else ""
        raise SimError(_describe(err, model) + suffix, source=source, field=path) from None
