"""Neuron-cache policies behind one interface, trace replay and miss-ratio comparisons.

``make_policy("s3fifo", capacity_bytes, n_items, item_bytes)`` builds a policy by its CLI
name; :class:`~sim.cache.base.CachePolicy` documents the step model (batched requests,
pinned keys, bypass). :mod:`sim.cache.layout` maps (layer, expert, neuron) to cache keys;
:mod:`sim.cache.replay` replays whole traces, :class:`~sim.cache.stepwise.StepwiseCache`
one (token, layer, expert) step at a time (to check the replay), and
:mod:`sim.cache.compare` turns replays into miss-ratio curves, and
:mod:`sim.cache.stack_distance` gives LRU's at every size in one pass. The engine's cache (a pinned
hot region plus one of these policies) is :class:`sim.engine.neuron_cache.NeuronCache`.
"""

from sim.cache import arc, belady, clock, fifo, lfu, lru, pi2_segmented, s3fifo, sieve, static_hot, window
from sim.cache.base import POLICIES, CachePolicy, RunResult, StepResult, make_policy, policy_class, policy_options
from sim.cache.stack_distance import lru_misses, stack_distances

# The order policies are listed in (help texts, default comparisons, plots).
POLICY_NAMES = ("lru", "fifo", "lfu", "clock", "s3fifo", "sieve", "arc", "static-hot", "window",
                "pi2-segmented", "belady")
assert set(POLICY_NAMES) == set(POLICIES), "every policy module must be imported above"
del arc, belady, clock, fifo, lfu, lru, pi2_segmented, s3fifo, sieve, static_hot, window

__all__ = ["POLICIES", "POLICY_NAMES", "CachePolicy", "RunResult", "StepResult", "lru_misses", "make_policy",
           "policy_class", "policy_options", "stack_distances"]
