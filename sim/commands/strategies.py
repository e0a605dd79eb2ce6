"""`sim strategies [NAME]`: the execution strategies and the knobs `--set` can change.

A knob is only discoverable from an error message otherwise; this lists each one with its
type, default and what it means (the knob model's field descriptions, with their sources).
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sim.outputs import json_text


def register(app: typer.Typer) -> None:
    app.command("strategies")(strategies)


def strategies(
    name: str | None = typer.Argument(None, help="A strategy: list its knobs (default: list the strategies)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the execution strategies, or one strategy's knobs with their defaults."""
    from sim.engine.strategies import REGISTRY, get_strategy
    from sim.errors import SimError

    try:
        if name is not None:
            get_strategy(name)
    except SimError as exc:
        raise SimError(exc.detail, field="NAME") from None
    if name is None:
        rows = [{"name": n, "summary": REGISTRY[n].summary, "knobs": list(REGISTRY[n].knobs_model.model_fields)}
                for n in sorted(REGISTRY)]
        if json_out:
            print(json_text(rows))
            return
        table = Table("strategy", "what it models", title="strategies (sim strategies NAME lists its knobs)")
        for r in rows:
            table.add_row(escape(r["name"]), escape(r["summary"]))
        Console().print(table)
        return
    rows = knob_rows(name)
    if json_out:
        print(json_text(rows))
        return
    title = f"{name} knobs (sim run --strategy {name} --set KNOB=VALUE)"
    table = Table("knob", "type", "default", "meaning", title=title)
    for r in rows:  # types and sources have brackets, which rich would read as markup
        default = "-" if r["default"] is None else json.dumps(r["default"]).strip('"')  # as YAML spells it
        table.add_row(*(escape(text) for text in (r["knob"], r["type"], default, r["description"])))
    Console().print(table)


def knob_rows(name: str) -> list[dict[str, Any]]:
    """Each knob of strategy ``name``: its name, type, default and description."""
    from sim.engine.strategies import get_strategy

    fields = get_strategy(name).knobs_model.model_fields
    return [{"knob": knob, "type": type_name(f.annotation), "default": f.default, "description": f.description or ""}
            for knob, f in fields.items()]


def type_name(annotation: Any) -> str:
    """A knob's type as a user writes it: ``int``, ``list[str]``, ``npu|gpu``, with ``| null`` (YAML's
    spelling of "leave it to the default") when optional."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        inner = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(inner) + (" | null" if type(None) in args else "")
    if origin is list:
        return f"list[{type_name(args[0])}]"
    return getattr(annotation, "__name__", str(annotation))
