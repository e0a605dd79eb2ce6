"""The ``sim`` command: a thin shell over the library.

Each command group lives in ``sim/commands/<name>.py`` exposing a typer ``app`` (a group)
or a ``register(app)`` function (top-level commands). User errors surface as one line,
``error: <file>: <field>: <message>``, with exit status 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from sim.errors import SimError

app = typer.Typer(
    name="sim",
    help="Simulate sparse LLM inference on phone hardware (PowerInfer-2, LLM in a Flash).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules, in help order. Groups are mounted under their name; modules with
# ``register`` add top-level commands.
COMMAND_MODULES = ["profiles", "memory"]


def _mount() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"sim.commands.{name}")
        if hasattr(module, "register"):
            module.register(app)
        else:
            app.add_typer(module.app, name=name)


_mount()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning SimError into a one-line message and exit 2."""
    try:
        app(args=argv, prog_name="sim", standalone_mode=False)
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except Exception as exc:  # click usage errors and friends
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            return exc.exit_code
        if isinstance(exc, click.exceptions.Abort):
            print("error: aborted", file=sys.stderr)
            return 130
        if isinstance(exc, click.exceptions.Exit):
            return exc.exit_code
        raise
    return 0


def _console() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _console()
