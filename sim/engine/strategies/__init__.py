"""Execution strategies, one per file; importing this package registers them all."""

from sim.engine.strategies import dense, llamacpp, llm_in_flash, powerinfer2  # noqa: F401
from sim.engine.strategies.base import REGISTRY, Strategy, get_strategy

__all__ = ["REGISTRY", "Strategy", "get_strategy"]
