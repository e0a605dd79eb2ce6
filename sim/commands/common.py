"""Option checks shared by several commands (the output helpers live in :mod:`sim.outputs`)."""

from __future__ import annotations

from sim.outputs import PLOT_SUFFIXES, check_output, finite, json_text

__all__ = ["PLOT_SUFFIXES", "check_output", "finite", "json_text"]
