"""S3-FIFO: small probationary queue, main queue, ghost."""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np
import pytest
from cache_helpers import csr
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cache import make_policy
from sim.cache.s3fifo import R_GHOST, R_MAIN, R_SMALL, S3FIFO
from sim.errors import SimError


def test_scan_resistance_beats_lru():
    rng = np.random.default_rng(0)
    hot = [[int(k)] for k in rng.integers(0, 20, 3000)]
    scan = [[100 + i] for i in range(3000)]
    steps = [s for pair in zip(hot, scan, strict=True) for s in pair]
    items, offsets = csr(steps)
    s3 = make_policy("s3fifo", 30, 4000).run(items, offsets).hit.sum()
    lru = make_policy("lru", 30, 4000).run(items, offsets).hit.sum()
    assert s3 > 1.3 * lru


def test_ghost_hit_goes_to_main():
    s3 = S3FIFO(20, 100)  # small queue 2, main 18, ghost 18
    for k in range(0, 25):  # fills main first (before any eviction), then small
        s3.step([k])
    ghosts = np.flatnonzero(s3._res == R_GHOST)
    assert ghosts.size > 0
    g = int(ghosts[0])
    out = s3.step([g])
    assert not out.hit[0] and s3._res[g] == R_MAIN


def test_new_items_enter_the_small_queue_once_it_has_evicted():
    s3 = S3FIFO(20, 100)
    for k in range(30):
        s3.step([k])
    s3.step([50])
    assert s3._res[50] == R_SMALL


def test_rejects_bad_ratios():
    with pytest.raises(SimError, match="small_size_ratio"):
        S3FIFO(20, 10, small_size_ratio=1.5)


class ReferenceS3FIFO:
    """Batched S3-FIFO in plain Python (deques and an ordered dict), written from the rules in
    sim.cache.s3fifo's docstring and base.py's step model: what the ring kernel must match on
    multi-key (pinned) steps, which libCacheSim's one-key streams never exercise."""

    def __init__(self, capacity: int, small_ratio: float = 0.1, ghost_ratio: float = 0.9, threshold: int = 2):
        self.cap, self.small_cap = capacity, int(capacity * small_ratio)
        self.main_cap, self.ghost_cap = capacity - self.small_cap, int(capacity * ghost_ratio)
        self.threshold = threshold
        self.small: deque[int] = deque()  # left: oldest
        self.main: deque[int] = deque()
        self.ghost: OrderedDict[int, int] = OrderedDict()  # key -> size, oldest first
        self.where: dict[int, str] = {}
        self.size: dict[int, int] = {}
        self.freq: dict[int, int] = {}
        self.has_evicted = False

    def used(self, queue: deque[int]) -> int:
        return sum(self.size[k] for k in queue)

    def _forget_ghosts(self, need: int) -> None:
        while sum(self.ghost.values()) + need > self.ghost_cap:
            self.ghost.popitem(last=False)

    def step(self, keys: list[int], sizes: list[int]) -> tuple[list[bool], list[int]]:
        hits, evicted, ghost_hit = [], [], set()
        pinned = set()
        for k in keys:
            hit = self.where.get(k) in ("small", "main")
            hits.append(hit)
            if hit:
                pinned.add(k)
                self.freq[k] += 1
            elif k in self.ghost:
                del self.ghost[k]
                ghost_hit.add(k)
        for k, sz, hit in zip(keys, sizes, hits, strict=True):
            pinned_bytes = sum(self.size[p] for p in pinned)
            if hit or sz > self.cap - pinned_bytes or sz > self.small_cap:
                continue
            while self.used(self.small) + self.used(self.main) + sz > self.cap:
                self.has_evicted = True
                small_free = any(v not in pinned for v in self.small)
                main_free = any(v not in pinned for v in self.main)
                use_main = self.used(self.main) > self.main_cap or not self.small
                if use_main and not main_free:
                    use_main = False
                elif not use_main and not small_free:
                    use_main = True
                if use_main:
                    while True:
                        v = self.main.popleft()
                        if v in pinned or self.freq[v] >= 1:
                            if v not in pinned:
                                self.freq[v] = min(self.freq[v], 3) - 1
                            self.main.append(v)
                            continue
                        del self.where[v]
                        evicted.append(v)
                        break
                else:
                    while any(v not in pinned for v in self.small):
                        v = self.small.popleft()
                        if v in pinned:
                            self.small.append(v)
                        elif self.freq[v] >= self.threshold:
                            self.main.append(v)
                            self.where[v], self.freq[v] = "main", 0
                        else:
                            del self.where[v]
                            evicted.append(v)
                            if self.ghost_cap > 0 and self.size[v] <= self.ghost_cap:
                                self._forget_ghosts(self.size[v])
                                self.ghost[v] = self.size[v]
                            break
            if k not in ghost_hit and sz >= self.small_cap:
                continue
            self.size[k], self.freq[k] = sz, 0
            pinned.add(k)
            if k in ghost_hit or (not self.has_evicted and self.used(self.small) >= self.small_cap):
                self.main.append(k)
                self.where[k] = "main"
            else:
                self.small.append(k)
                self.where[k] = "small"
        return hits, evicted


@settings(max_examples=150, deadline=None)
@given(data=st.data(), capacity=st.integers(10, 60), small=st.sampled_from([0.1, 0.25, 0.5]),
       ghost=st.sampled_from([0.0, 0.5, 0.9, 3.0]), threshold=st.integers(1, 3), blocks=st.integers(1, 4))
def test_batched_steps_match_the_plain_python_reference(data, capacity, small, ghost, threshold, blocks):
    """Hits and evictions, step by step, on multi-key steps with mixed sizes, over several calls
    (the rings and their positions carry over between blocks)."""
    n_items = data.draw(st.integers(3, 40))
    item_bytes = np.array(data.draw(st.lists(st.integers(1, 6), min_size=n_items, max_size=n_items)))
    ours = S3FIFO(capacity, n_items, item_bytes, small_size_ratio=small, ghost_size_ratio=ghost,
                  move_to_main_threshold=threshold)
    ref = ReferenceS3FIFO(capacity, small, ghost, threshold)
    for _ in range(blocks):
        steps = data.draw(st.lists(st.lists(st.integers(0, n_items - 1), min_size=1, max_size=5, unique=True),
                                   min_size=1, max_size=80))
        for keys in steps:
            out = ours.step(keys)
            hits, evicted = ref.step(keys, [int(item_bytes[k]) for k in keys])
            assert out.hit.tolist() == hits
            assert sorted(out.evicted.tolist()) == sorted(evicted)
