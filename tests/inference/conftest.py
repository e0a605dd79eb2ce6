"""Shared fixtures for the numpy inference core's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.errors import SimError
from sim.inference.fetch import ensure_minilm, is_cached, minilm_dir

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "traces" / "corpus" / "pride_and_prejudice_ch1.txt"
SHIPPED_TRACE = ROOT / "traces" / "minilm-l6-v2.npz"


@pytest.fixture
def corpus() -> Path:
    return CORPUS


@pytest.fixture
def short_text(tmp_path: Path) -> Path:
    path = tmp_path / "short.txt"
    path.write_text("It is a truth universally acknowledged, that a single man in possession of a good "
                    "fortune, must be in want of a wife.", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The real checkpoint's directory, fetched by the setup step if needed.

    Skips (never fails) when it is not cached and cannot be fetched, e.g. offline.
    """
    if is_cached():
        return minilm_dir()
    try:
        return ensure_minilm(timeout_s=10)
    except SimError as exc:
        pytest.skip(f"all-MiniLM-L6-v2 is not cached and could not be fetched ({exc})")


@pytest.fixture(scope="session")
def smollm2():
    """The numpy SmolLM2-135M decoder, loaded once (about 20 s); skips when not fetched."""
    from sim.inference.fetch import smollm2_cached
    from sim.inference.llama import load_llama

    if not smollm2_cached():
        pytest.skip("SmolLM2-135M is not fetched: run `python -m sim.inference.fetch smollm2`")
    return load_llama("smollm2-135m")
