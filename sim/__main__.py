"""``python -m sim`` runs the CLI, as the ``sim`` console script does."""

from sim.cli import _console

_console()
