"""Packaging that pyproject.toml cannot express: the top-level data folders ship in the wheel.

``device_profiles/``, ``model_profiles/``, ``trace_presets/`` and ``validation/`` stay at the
repository's top level and are mapped into the package as ``sim.data.<folder>`` (see
``sim/bundled.py``), so a wheel carries them inside ``sim/data/`` and an editable install
resolves the same names to the top-level folders. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

DATA_FOLDERS = ("device_profiles", "model_profiles", "trace_presets", "validation")

setup(
    packages=find_packages(include=["sim", "sim.*"]) + [f"sim.data.{name}" for name in DATA_FOLDERS],
    package_dir={f"sim.data.{name}": name for name in DATA_FOLDERS},
    package_data={f"sim.data.{name}": ["*.yaml", "*.md"] for name in DATA_FOLDERS},
)
