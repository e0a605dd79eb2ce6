"""The flags of a run's options, made from :class:`~sim.engine.config.RunConfig`'s fields.

RunConfig is the one list of a run's options: each field's default and description are
its flag's (``decode_tokens`` is ``--decode-tokens``), so an option the engine gains is a
flag of ``sim run`` at once, and no command spells one out again. Two ways to take them:

- :func:`with_run_options` gives a command every run option as a flag, ahead of its own
  parameters, in RunConfig's order; the command receives them as keyword arguments
  (collect them with ``**options`` and build ``RunConfig.of(**options)``). ``sim run`` is made
  so, and a command that runs configurations as ``sim run`` does (``sim ablate``) can be too.
- :func:`run_option` is one run option's flag, for a command that places a few among its
  own (``sim plan``'s ``--device``, ``sim validate``'s ``--decode-tokens``), with its own default
  or help where its meaning there differs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic.fields import FieldInfo

from sim.engine.config import RunConfig

F = TypeVar("F", bound=Callable[..., Any])

# A field typed for more than a command line gives (a profile object, a Trace) names its flag's type.
CLI_TYPES: dict[str, Any] = {"text": str, "path": Path}


def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def flag_name(name: str) -> str:
    """The flag of run option ``name``: ``--decode-tokens`` for ``decode_tokens``."""
    return "--" + name.replace("_", "-")


def flagged_options() -> tuple[str, ...]:
    """The run options that are flags, in ``sim run --help`` order (knobs and profile edits
    come through ``--set`` and ``--plan`` instead)."""
    return tuple(name for name, field in RunConfig.model_fields.items() if _extra(field).get("flag", True))


def option_type(name: str) -> Any:
    """The type typer parses run option ``name``'s flag value as (Optional when it defaults to None)."""
    field = RunConfig.model_fields[name]
    cli = _extra(field).get("cli")
    if cli is None:
        return field.annotation
    return CLI_TYPES[cli] | None if field.default is None else CLI_TYPES[cli]


def run_option(name: str, default: Any = inspect.Parameter.empty, help: str | None = None, **typer_options: Any) -> Any:
    """Run option ``name``'s flag (a ``typer.Option``): RunConfig's default and description unless
    ``default`` (``...``: required) or ``help`` say otherwise for this command."""
    field = RunConfig.model_fields[name]
    if name not in flagged_options():
        raise ValueError(f"run option {name!r} has no flag of its own")
    value = field.default if default is inspect.Parameter.empty else default
    return typer.Option(value, flag_name(name), help=help or field.description, **typer_options)


# Run options whose flag takes more than RunConfig's field does: `--decode-tokens auto`
# (sim.engine.run_length) is a count or a word, resolved by sim run's request.
WIDER_FLAGS: dict[str, tuple[Any, str]] = {
    "decode_tokens": (str, "Tokens to generate, or auto: until the 95% interval's half-width is within 2% "
                           "(see sim.engine.run_length)."),
}


def run_parameters(exclude: tuple[str, ...] = (), wider: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """Every flagged run option but ``exclude`` as a parameter typer reads (name, flag, type);
    those in ``wider`` take :data:`WIDER_FLAGS`' type and help instead."""
    params = []
    for name in flagged_options():
        if name in exclude:
            continue
        kind, help = WIDER_FLAGS[name] if name in wider else (option_type(name), None)
        default = str(RunConfig.model_fields[name].default) if name in wider else inspect.Parameter.empty
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=run_option(name, default, help),
                                        annotation=kind))
    return params


def with_run_options(exclude: tuple[str, ...] = (), wider: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Decorator: the command takes every run option (but ``exclude``) as a flag, listed before its
    own parameters, and receives them as keyword arguments (its ``**options``); ``wider`` names
    options whose flag takes more than a RunConfig field (:data:`WIDER_FLAGS`)."""

    def decorate(command: F) -> F:
        params = inspect.signature(command, eval_str=True).parameters.values()
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        clash = {p.name for p in own} & set(flagged_options())
        if clash:
            raise ValueError(f"{command.__name__} declares run option(s) {sorted(clash)} itself")
        command.__signature__ = inspect.Signature([*run_parameters(exclude, wider), *own])  # type: ignore[attr-defined]
        return command

    return decorate
