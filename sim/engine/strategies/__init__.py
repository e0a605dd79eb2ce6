"""Execution strategies, one per file; importing this package registers them all.

Look a strategy up here (:func:`get_strategy`), not in ``base``: the lookup lives beside the
imports that fill the registry, so no module below this package needs to import it back.
"""

from sim.engine.strategies import dense, llamacpp, llm_in_flash, powerinfer2  # noqa: F401
from sim.engine.strategies.base import REGISTRY, Strategy
from sim.errors import SimError


def get_strategy(name: str) -> type[Strategy]:
    """The registered strategy class called ``name`` (the CLI's ``--strategy``)."""
    if name not in REGISTRY:
        raise SimError(f"unknown strategy {name!r}; choose one of {', '.join(sorted(REGISTRY))}",
                       field="--strategy")
    return REGISTRY[name]


__all__ = ["REGISTRY", "Strategy", "get_strategy"]
