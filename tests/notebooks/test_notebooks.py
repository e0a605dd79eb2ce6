"""notebooks/*.ipynb run top to bottom in small mode, and are committed without outputs.

Each notebook is executed in a fresh kernel with ``PHONESIM_SMALL=1`` (few tokens, few
points; see :func:`sim.studies.small_mode`) from the notebooks folder, as a user opening it
would. A cell that raises fails the test with the cell's error.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ["01_quickstart.ipynb", "02_design_space.ipynb", "03_cache_policies.ipynb", "04_validation.ipynb"]


def test_the_four_notebooks_are_there():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.parametrize("name", NAMES)
def test_runs_top_to_bottom_in_small_mode(name, monkeypatch):
    monkeypatch.setenv("PHONESIM_SMALL", "1")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet debugger warning at kernel start
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert figures, "every notebook draws at least one figure"
    assert any("small mode" in o.get("text", "") for o in outputs if o.output_type == "stream")
