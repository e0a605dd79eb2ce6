"""The neuron cache as the engine uses it: a pinned hot region plus a policy-managed rest.

PowerInfer-2's segmented cache [PI2 §4.3] keeps the hottest neurons (found by offline
profiling) in a hot region and manages the remaining capacity neuron by neuron. The hot
region here holds the ``hot_share`` most popular neurons and never evicts them; the rest
of the budget goes to any policy of :mod:`sim.cache` (LRU by default). A hot share of 0
gives a plain policy (LLM in a Flash's window, a page cache); ``static`` gives no policy at
all, the whole budget pinned (a runtime without a dynamic cache, the baseline of [PI2] §7.5's
ablation).
"""

from __future__ import annotations

import numpy as np

from sim.cache.base import CachePolicy
from sim.checks import shown
from sim.engine.scheduler import top_counted
from sim.errors import SimError


def check_timed_policy(policy: str, keeps_profile: bool, field: str = "--policy") -> type:
    """The policy class if ``policy`` can serve a timed run of a strategy, else a one-line error.

    One rule for every strategy and for :func:`sim.engine.simulation.check_options` (so a
    sweep refuses it before running): an offline-only policy (Belady needs the future)
    never can, and one that needs an offline hot-neuron profile only where the strategy
    keeps one.
    """
    from sim.cache import POLICY_NAMES, policy_class

    if not isinstance(policy, str) or policy not in POLICY_NAMES:  # offer only what this run can take
        usable = [n for n in POLICY_NAMES if _timed_usable(n, keeps_profile)]
        raise SimError(f"unknown policy {shown(policy)}; choose one of {', '.join(usable)}", field=field)
    cls = policy_class(policy)
    if cls.needs_future:
        raise SimError(f"{policy} needs the future of the trace (an offline bound); compare it with "
                       "`sim cache compare`, not in a timed run", field=field)
    if cls.needs_profile and not keeps_profile:
        raise SimError(f"{policy} needs an offline hot-neuron profile, which only the powerinfer2 strategy "
                       "keeps; choose another policy or strategy", field=field)
    return cls


def plan_policies(keeps_profile: bool) -> list[str]:
    """The cache policies ``sim plan`` tries for a strategy (in the registry's order): those the
    registry marks as plan candidates that a timed run of the strategy can take."""
    from sim.cache import POLICY_NAMES, policy_class

    return [name for name in POLICY_NAMES if policy_class(name).plan_candidate and _timed_usable(name, keeps_profile)]


def _timed_usable(name: str, keeps_profile: bool) -> bool:
    """Whether policy ``name`` can serve a timed run of a strategy that keeps (or not) the profile."""
    from sim.cache import policy_class

    cls = policy_class(name)
    return not cls.needs_future and (keeps_profile or not cls.needs_profile)


def timed_policy_options(policy: str, popularity: np.ndarray | None, options: dict | None = None) -> dict:
    """The options a timed run gives cache policy ``policy`` (checked by :func:`check_timed_policy`)."""
    out = dict(options or {})
    if check_timed_policy(policy, keeps_profile=popularity is not None).needs_profile:
        out.setdefault("profile_counts", popularity)
    return out


_MAX_COUNT = 1 << 20  # profile counts are at most the profiled tokens; beyond this, sort


def _top(popularity: np.ndarray, n: int, exclude: np.ndarray | None) -> np.ndarray:
    """The ``n`` most popular keys outside ``exclude``, least popular first, ties in key order
    (:func:`~sim.engine.scheduler.top_counted` for activation counts; a sort otherwise)."""
    counted = np.issubdtype(popularity.dtype, np.integer) and popularity.size and popularity.min() >= 0
    if counted and popularity.max() <= _MAX_COUNT:  # a histogram of that many bins is cheap
        return top_counted(popularity, n, np.zeros(0, dtype=np.bool_) if exclude is None else exclude)
    keys = np.arange(popularity.size) if exclude is None else np.flatnonzero(~exclude)
    chosen = keys[np.lexsort((keys, -popularity[keys]))][:n]  # most popular first, ties by key
    return chosen[np.lexsort((chosen, popularity[chosen]))]


def pinned_split(n_keys: int, item_bytes: int, capacity_bytes: int, popularity: np.ndarray | None,
                 hot_share: float, static: bool = False) -> tuple[int, int]:
    """(keys pinned in the hot region, the rest's capacity in bytes) of a :class:`NeuronCache`.
    Only neurons the profile saw fire are pinned by share; ``static`` pins the whole capacity."""
    n_hot = 0
    if popularity is not None and (static or hot_share > 0):
        n_hot = (min(capacity_bytes // item_bytes, n_keys) if static else
                 min(int(capacity_bytes * hot_share) // item_bytes, int(np.count_nonzero(popularity))))
    return n_hot, 0 if static else max(0, capacity_bytes - n_hot * item_bytes)


def popularity_ranks(popularity: np.ndarray) -> np.ndarray:
    """Each key's place in the order :class:`NeuronCache` pins and preloads by (0: the most
    counted; ties by key, the lowest first, as :func:`~sim.engine.scheduler.top_counted` takes them)."""
    order = np.lexsort((np.arange(popularity.size), -popularity.astype(np.int64)))
    ranks = np.empty(popularity.size, dtype=np.int32)
    ranks[order] = np.arange(popularity.size, dtype=np.int32)
    return ranks


class NeuronCache:
    def __init__(self, n_keys: int, item_bytes: int, capacity_bytes: int, popularity: np.ndarray | None,
                 hot_share: float, policy: str, policy_options: dict | None = None, preload: bool = True,
                 static: bool = False):
        """``static``: the whole capacity is the pinned set, the offline profile's hottest neurons
        (whether or not they fired in it), and nothing else is ever kept: every other neuron
        misses each time it is needed."""
        from sim.cache import make_policy

        self.item_bytes = item_bytes
        n_hot, self.cold_capacity = pinned_split(n_keys, item_bytes, capacity_bytes, popularity, hot_share, static)
        self.is_hot = np.zeros(n_keys, dtype=bool)
        if n_hot > 0:
            self.is_hot[_top(popularity, n_hot, None)] = True
        self.hot_bytes = n_hot * item_bytes
        options = timed_policy_options(policy, popularity, policy_options)
        self.policy: CachePolicy = make_policy(policy, capacity_bytes=self.cold_capacity, n_items=n_keys,
                                               item_bytes=item_bytes, **options)
        if popularity is not None and preload:
            self._preload(popularity)

    def _preload(self, popularity: np.ndarray) -> None:
        """Fill the cold region at load time with the next most popular neurons.

        A runtime loads its cache before the first token (PowerInfer-2 fills the neuron
        cache from the offline profile); starting empty would charge every run for misses
        no real session pays. Keys go in from least to most popular, so recency-based
        policies see the hottest as most recent.
        """
        fit = self.cold_capacity // self.item_bytes
        if fit <= 0:
            return
        order = _top(popularity, fit, self.is_hot)
        if order.size == 0:
            return
        # one step at token -1 (before the run), as the replay fast path: no eviction list
        self.policy.run(order.astype(np.int64), np.array([0, order.size]), tokens=np.array([-1]))

    def cold_hits(self, cold: np.ndarray, offsets: np.ndarray, token: int) -> np.ndarray:
        """Serve keys outside the hot region (``cold[offsets[i]:offsets[i+1]]`` is step i) through
        the policy; returns per key whether it was resident."""
        if not cold.size:
            return np.zeros(0, dtype=bool)
        tokens = np.full(offsets.size - 1, token, dtype=np.int64)
        return self.policy.run(cold, offsets, tokens=tokens, check=False).hit
