"""`sim profiles ...`: list, show, validate and export the schema of profiles."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sim.errors import SimError
from sim.outputs import json_text
from sim.profiles.device import DeviceProfile
from sim.profiles.diff import diff_rows
from sim.profiles.model import ModelProfile
from sim.profiles.registry import KINDS, bundled_names, detect_kind, load_profile_file, resolve_path

app = typer.Typer(help="List, show and validate device and model profiles.", no_args_is_help=True)


@app.command("list")
def list_profiles(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List bundled device and model profiles."""
    rows = []
    for kind in KINDS:
        for name in bundled_names(kind):
            prof = load_profile_file(kind, resolve_path(kind, name))
            rows.append({"kind": kind, "name": name, "description": getattr(prof, "description", "")})
    if json_out:
        print(json_text(rows))
        return
    table = Table("kind", "name", "description")
    for r in rows:
        table.add_row(r["kind"], r["name"], r["description"])
    Console().print(table)


@app.command("show")
def show(name: str = typer.Argument(..., help="Profile name or path."),
         json_out: bool = typer.Option(False, "--json", help="Print JSON instead of YAML.")) -> None:
    """Print one profile, validated and with defaults filled in."""
    matches = []
    for kind in KINDS:
        try:
            path = resolve_path(kind, name)
        except SimError:
            continue
        if path.is_file():
            kind_here = detect_kind(path) if "/" in name or name.endswith((".yaml", ".yml")) else kind
            matches.append(load_profile_file(kind_here, path))
            break
    if not matches and ("/" in name or name.endswith((".yaml", ".yml"))):  # a path, not a misspelt name
        raise SimError("is a folder; give a profile file (.yaml)" if Path(name).is_dir() else "no such file",
                       source=name, field="NAME")
    if not matches:
        names = ", ".join(bundled_names("device") + bundled_names("model"))
        raise SimError(f"unknown profile {name!r}; bundled: {names}", field="NAME")
    data = matches[0].model_dump(mode="json")
    print(json_text(data) + "\n" if json_out else yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")


@app.command("validate")
def validate_files(paths: list[Path] = typer.Argument(..., help="YAML files to check.")) -> None:
    """Validate profile files; prints one line per file, exits 2 on the first bad one."""
    for path in paths:
        kind = detect_kind(path)
        load_profile_file(kind, path)
        print(f"ok: {path} ({kind})")


@app.command("schema")
def schema(kind: str = typer.Option("all", "--kind", help="device, model or all.")) -> None:
    """Print the JSON Schema of the profile kinds (for editor validation of YAML)."""
    schemas = {"device": DeviceProfile.model_json_schema(), "model": ModelProfile.model_json_schema()}
    if kind == "all":
        print(json.dumps(schemas, indent=2))
    elif kind in schemas:
        print(json.dumps(schemas[kind], indent=2))
    else:
        raise SimError(f"must be one of device, model, all; got {kind!r}", field="--kind")


@app.command("diff")
def diff(a: Path = typer.Argument(..., help="First profile (name or YAML path)."),
         b: Path = typer.Argument(..., help="Second profile (name or YAML path), of the same kind."),
         changed: bool = typer.Option(False, "--changed", help="Only the fields that differ."),
         json_out: bool = typer.Option(False, "--json", help="Print JSON rows.")) -> None:
    """Show two profiles side by side, field by field, with the ratio b / a of each number."""
    loaded = []
    for ref, flag in ((a, "A"), (b, "B")):
        text = str(ref)
        is_path = "/" in text or text.endswith((".yaml", ".yml"))
        kind = detect_kind(ref) if is_path else ("device" if text in bundled_names("device") else "model")
        if not is_path and text not in bundled_names(kind):
            names = ", ".join(bundled_names("device") + bundled_names("model"))
            raise SimError(f"unknown profile {text!r}; give a YAML path or a bundled name: {names}", field=flag)
        loaded.append((kind, load_profile_file(kind, resolve_path(kind, text))))
    if loaded[0][0] != loaded[1][0]:
        raise SimError(f"cannot compare a {loaded[0][0]} profile with a {loaded[1][0]} profile", field="B")
    rows = diff_rows(loaded[0][1], loaded[1][1], all_fields=not changed)
    if json_out:
        print(json_text(rows))
        return

    def shown(v: object) -> str:
        return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))

    table = Table(title=f"{a} (a) against {b} (b)")
    table.add_column("field", overflow="fold")
    table.add_column(f"a: {loaded[0][1].name}", overflow="fold")
    table.add_column(f"b: {loaded[1][1].name}", overflow="fold")
    table.add_column("b / a", justify="right")
    for r in rows:  # Text: field paths hold [brackets] that rich would read as markup
        table.add_row(Text(r["field"]), Text(shown(r["a"])), Text(shown(r["b"])),
                      "" if r["ratio"] is None else f"{r['ratio']:.3g}")
    Console().print(table)
