"""`sim cache-dir`: where generated traces are kept between runs, how much they take, and --clear."""

from __future__ import annotations

import json

import typer

from sim.units import format_bytes


def register(app: typer.Typer) -> None:
    app.command("cache-dir")(cache_dir)


def cache_dir(clear: bool = typer.Option(False, "--clear", help="Remove every stored trace."),
              json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the on-disk store of generated traces (path, entries, size, bound); --clear empties it.

    Runs keep every synthetic trace they generate here and read it back instead of generating
    it again. $PHONESIM_TRACE_CACHE moves it (or turns it off with ``off``);
    $PHONESIM_TRACE_CACHE_BYTES bounds it (oldest-used entries go first; default 2 GiB).
    """
    from sim.traces import store

    folder = store.store_dir()
    limit = store.limit_bytes()
    removed = store.clear(folder) if clear and folder is not None else 0
    info = {"path": None if folder is None else str(folder), "enabled": folder is not None,
            "entries": len(store.entries(folder)) if folder is not None else 0,
            "size_bytes": store.size_bytes(folder) if folder is not None else 0, "limit_bytes": limit}
    if clear:
        info["removed"] = removed
    if json_out:
        print(json.dumps(info))
        return
    if folder is None:
        print(f"trace store off (${store.ENV_DIR}={store.OFF}): every run generates its trace")
        return
    print(f"{folder}")
    print(f"  {info['entries']} stored trace{'s' if info['entries'] != 1 else ''}, {format_bytes(info['size_bytes'])}"
          f" of at most {format_bytes(limit)}" + (f" (removed {removed} file{'s' if removed != 1 else ''})"
                                                  if clear else ""))
