"""The ``sim`` command: a thin shell over the library.

Each command group lives in ``sim/commands/<name>.py`` exposing a typer ``app`` (a group)
or a ``register(app)`` function (top-level commands). User errors surface as one line,
``error: <file>: <field>: <message>``, with exit status 2.
"""

from __future__ import annotations

import importlib
import re
import sys

import typer

from sim import kernel_cache
from sim.errors import SimError, Stopped, interrupt_behind

app = typer.Typer(
    name="sim",
    help="Simulate sparse LLM inference on phone hardware (PowerInfer-2, LLM in a Flash).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

INTERRUPTED = 130  # exit status after Ctrl-C (128 + SIGINT), as shells report it; commands never use it otherwise

# Command modules, in help order. Groups are mounted under their name; modules with
# ``register`` add top-level commands.
COMMAND_MODULES = ["run", "ablate", "compare", "sensitivity", "strategies", "validate", "calibrate", "profiles",
                   "profile_device", "memory", "cache", "cache_dir", "trace", "sweep", "plan", "infer"]


def _mount() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"sim.commands.{name}")
        if hasattr(module, "register"):
            module.register(app)
        else:
            app.add_typer(module.app, name=name)


_mount()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; user errors become one line on stderr and exit status 2."""
    try:
        rc = app(args=argv, prog_name="sim", standalone_mode=False)
        if rc == INTERRUPTED:  # typer turns a Ctrl-C no command handled into Exit(130), silently
            print("error: interrupted", file=sys.stderr)
        if isinstance(rc, int) and rc:  # `raise typer.Exit(n)` comes back as n without standalone mode
            return rc
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Stopped as exc:  # a command that saved its work first says what it kept
        print(exc.message, file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return INTERRUPTED
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except OSError as exc:  # disk full, permissions, a path that vanished: the user's to fix
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        # Usage errors from typer's bundled click (typer._click) or a standalone click:
        # recognised by their interface, so either vendoring works.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            param = getattr(exc, "param", None)
            where = ""
            if param is not None:
                opts = getattr(param, "opts", None) or [getattr(param, "name", "")]
                where = f"{opts[0]}: "
            message = " ".join(str(exc.format_message()).split())
            if where:  # click's "Invalid value for '--x': ..." would name the flag a second time
                message = re.sub(r"^Invalid value for '[^']*': ", "", message)
            if message or where:  # an empty one is `sim` with no arguments: the help was the answer
                print(f"error: {where}{message}", file=sys.stderr)
            return int(exc.exit_code) or 2
        if interrupt_behind(exc) is not None:  # Ctrl-C inside a compiled (numba) kernel
            print("error: interrupted", file=sys.stderr)
            return INTERRUPTED
        if type(exc).__name__ in ("Abort", "Exit"):
            return int(getattr(exc, "exit_code", 1) or 0)
        repaired = kernel_cache.repair(exc)  # a corrupt numba cache file: removed, so a rerun works
        if repaired:
            print(f"error: {repaired}", file=sys.stderr)
            return 2
        raise
    return 0


def _console() -> None:
    from sim import compile_notice

    compile_notice.install()  # a first run says that it is compiling kernels, instead of seconds of silence
    sys.exit(main())


if __name__ == "__main__":
    _console()
