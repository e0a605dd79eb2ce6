"""`sim profile-device`: measure this device and write it as a device profile."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sim.errors import SimError
from sim.outputs import check_output
from sim.profiling import runner, summary, writer
from sim.units import parse_bytes

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # DeviceProfile.name


def register(app: typer.Typer) -> None:
    app.command("profile-device")(profile_device)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the run as Ctrl-C does, so the test file is removed either way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def profile_name(out: Path) -> str:
    """The profile's name: the output file's stem, as bundled profiles are named."""
    name = out.stem.lower()
    if not NAME.match(name):
        raise SimError("the file name (less .yaml) is the profile's name and must be lower-case letters, digits, "
                       f"'.', '_' or '-', starting with a letter or digit; got {out.stem!r}", source=str(out),
                       field="--out")
    return name


def profile_device(
    out: Path = typer.Option(..., "--out", help="Where to write the profile (.yaml or .yml)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer, shorter measurements (well under a minute)."),
    storage_path: Path | None = typer.Option(None, "--storage-path",
                                             help="Folder on the storage to measure (default: --out's folder)."),
    max_bytes: str = typer.Option("2GB", "--max-bytes", help="Test file size (--quick caps it at 256MiB)."),
    measure_s: float | None = typer.Option(None, "--measure-s",
                                           help="Seconds per storage measurement (default 0.25 quick, 1 full)."),
) -> None:
    """Measure storage, DRAM and CPU with microbenchmarks and write a schema-valid device profile."""
    check_output(out, "--out", suffixes=(".yaml", ".yml"))
    name = profile_name(out)
    size = parse_bytes(max_bytes, field="--max-bytes")
    folder = storage_path if storage_path is not None else (out.parent if str(out.parent) else Path("."))
    settings = runner.plan(folder, size, quick=quick, measure_s=measure_s)
    err = Console(stderr=True)
    with _sigterm_as_interrupt(), Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                                           TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("starting", total=None)
        first = [True]

        def on_step(label: str) -> None:
            if not first[0]:
                bar.advance(task)
            first[0] = False
            bar.update(task, description=label)

        measured = runner.measure(settings, on_step=on_step, on_plan=lambda n: bar.update(task, total=n))
        bar.advance(task)
    text = writer.profile_text(measured, name)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)  # a whole file or none
    table = Table("measured", "value", title=f"{name} ({settings.file_bytes / 1e6:.0f} MB test file, "
                                              f"{'quick' if quick else 'full'} run)")
    for what, value in summary.summary_rows(measured):
        table.add_row(what, value)
    Console().print(table)
    print(f"wrote {out}: check it with `sim profiles validate {out}`, use it with `sim run --device {out}`")
