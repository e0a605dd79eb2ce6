"""`sim profiles ...`: list, show, validate and export the schema of profiles."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml
from rich.console import Console
from rich.table import Table

from sim.errors import SimError
from sim.outputs import json_text
from sim.profiles.device import DeviceProfile
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
