"""Where the bundled data folders are, in a checkout and in an installed wheel alike.

The device and model profiles, trace presets and published validation figures live in
top-level folders of the repository (``device_profiles/``, ``model_profiles/``,
``trace_presets/``, ``validation/``), where someone browsing it finds them. ``setup.py``
maps each into the package as ``sim.data.<folder>``, so a wheel carries them inside
``sim/data/`` and an editable install points the same names back at the top-level folders:
asking the import system for ``sim.data.<folder>`` finds them in both. A checkout used
without any install (``python -m sim`` from its root) falls back to the top-level folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

FOLDERS = ("device_profiles", "model_profiles", "trace_presets", "validation")


def bundled_dir(folder: str) -> Path:
    """The directory holding bundled ``folder`` (one of :data:`FOLDERS`)."""
    if folder not in FOLDERS:
        raise ValueError(f"unknown bundled folder {folder!r}; expected one of {', '.join(FOLDERS)}")
    try:
        spec = importlib.util.find_spec(f"sim.data.{folder}")
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            path = Path(location)
            if path.is_dir():
                return path
    return Path(__file__).resolve().parents[1] / folder
