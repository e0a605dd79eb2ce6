"""The one interface every neuron-cache policy implements, and the registry of policies.

Model of a cache step
---------------------
A *step* is a batch of requested item keys (a layer's active neurons for one token, or
one expert's), unique within the step, each with a size in bytes. Keys are dense ids in
``[0, n_items)``; callers map (layer, expert, neuron) or clusters onto them (see
:mod:`sim.cache.layout`). Within a step the requested keys are *pinned*: the policy never
evicts an item that the same step requested, because the FFN needs all of them at once.
A step runs in two phases:

1. every requested key that is resident is a hit and updates the policy's metadata;
2. every miss is loaded from flash; the policy evicts unpinned items until it fits and
   inserts it. If the bytes left after the pinned items cannot hold the miss, it is
   *bypassed*: read, used, dropped, never inserted (the same rule libCacheSim applies to
   objects larger than the cache), so occupancy never exceeds capacity.

With one key per step this is exactly the classic cache model, which is how the policies
are checked against libCacheSim (tests/cache/test_libcachesim_equality.py).

Every policy keeps its state in flat numpy arrays indexed by item and runs a numba kernel
over a whole CSR block of steps, so the same code serves the engine's per-step calls
(:meth:`CachePolicy.step`) and whole-trace replays (:meth:`CachePolicy.run`).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from sim.cache._lists import CAP, STEP, USED
from sim.checks import INT64_MAX, check_bool, check_int
from sim.checks import bound_text as _bound
from sim.checks import int_array as _int_array
from sim.checks import shown as _shown
from sim.errors import SimError

GHOST = 128  # item-state codes >= GHOST mark ghost (history-only, not resident) entries

# Argument limits. Item ids are int32 in the list-based policies; an item's size is at most
# 1 TiB (as in sim.cache.requests), so byte sums over many items stay far inside int64, and
# so does a capacity of at most 2**62 bytes plus one item.
MAX_ITEMS = 2**31 - 1
MAX_ITEM_BYTES = 2**40
MAX_CAPACITY_BYTES = 2**62
MAX_TOKEN = 2**62  # token indices: the window kernel computes ``token - window_tokens`` in int64


# -- argument checks shared by the policies ------------------------------------------------
# Every bad argument is a one-line SimError naming it and the allowed range; numpy scalars
# are taken as the Python numbers they are, booleans are not numbers.


def int64_bytes(x: float) -> int:
    """``int(x)`` for a finite byte count ``x >= 0``, saturated at the int64 maximum (a budget that
    large is unbounded; ``int`` alone would overflow the kernels' int64 scalars)."""
    return int(x) if x < 2.0**63 else INT64_MAX


def check_counts(value: Any, n_items: int, policy: str, field: str = "profile_counts") -> np.ndarray:
    """Per-item request counts of a profile: ``n_items`` finite numbers >= 0 (returned unchanged)."""
    if value is None:
        raise SimError(f"{policy} needs profile_counts (requests per item on a profiling trace)", field=field)
    try:
        counts = np.asarray(value)
    except (TypeError, ValueError, OverflowError):
        counts = None
    if counts is None or counts.dtype.kind not in "iuf":
        raise SimError(f"must be an array of n_items={n_items} request counts (numbers >= 0), got {_shown(value)}",
                       field=field)
    if counts.shape != (n_items,):
        raise SimError(f"must have n_items={n_items} entries, got shape {counts.shape}", field=field)
    if counts.size and ((counts.dtype.kind == "f" and not np.all(np.isfinite(counts))) or counts.min() < 0):
        raise SimError("every count must be a finite number >= 0", field=field)
    return counts


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outcome of one step: which requested keys hit, what was evicted, bytes read."""

    keys: np.ndarray  # int64, the requested keys in request order
    hit: np.ndarray  # bool, aligned with keys: resident when the step started
    evicted: np.ndarray  # int64 keys evicted during the step
    loaded_bytes: int  # bytes read from flash for the misses (inserted or bypassed)

    @property
    def hits(self) -> int:
        return int(np.count_nonzero(self.hit))

    @property
    def misses(self) -> int:
        return int(self.hit.shape[0] - np.count_nonzero(self.hit))

    @property
    def missed(self) -> np.ndarray:
        return self.keys[~self.hit]


@dataclass(frozen=True)
class RunResult:
    """Outcome of a block of steps, per request (aligned with the block's items)."""

    hit: np.ndarray  # bool per request
    evicted: np.ndarray | None  # keys evicted, when recording was asked for
    n_evicted: int
    loaded: np.ndarray | None = None  # see loaded_bytes; None: derived from the hits and sizes
    sizes: np.ndarray | None = None
    # with ``run(per_step=True)``, per step: evictions so far (``evicted[:evicted_ends[s]]`` were
    # evicted by steps 0..s) and the bytes resident after it
    evicted_ends: np.ndarray | None = None
    used_ends: np.ndarray | None = None

    @cached_property
    def loaded_bytes(self) -> np.ndarray:
        """int64 per request: bytes read from flash for it (0 on hits). Derived on first use:
        the engine's replay asks only for the hits."""
        if self.loaded is not None:
            return self.loaded
        assert self.sizes is not None
        return np.where(self.hit, 0, self.sizes)


class CachePolicy(ABC):
    """A neuron-cache eviction policy over items ``0 .. n_items-1`` with a byte capacity.

    Subclasses set ``name`` (through :func:`register`) and implement :meth:`_run`, a call
    into their numba kernel. Options specific to a policy are keyword-only constructor
    arguments, so the registry can route CLI options to the policies that accept them.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    needs_future: ClassVar[bool] = False  # needs next-use times (offline: Belady)
    needs_profile: ClassVar[bool] = False  # needs per-item request counts from a profile
    neuron_keys_only: ClassVar[bool] = False  # groups keys itself, so a layout must key single neurons
    item_arrays: ClassVar[bool] = True  # allocate the generic per-item state / size / pin arrays
    # `sim plan` tries it as a strategy's cache policy: a general-purpose policy worth its evaluations
    # (the others are baselines, bounds or special cases a plan would rarely pick)
    plan_candidate: ClassVar[bool] = False
    # its misses behind a pinned popular prefix, at any prefix and size, come from one pass
    # (sim.cache.pinned_lru_curve): recency order alone decides what it keeps
    pinned_curve: ClassVar[bool] = False

    def __init__(self, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1):
        self.capacity_bytes = check_int(capacity_bytes, "capacity_bytes", 0, MAX_CAPACITY_BYTES)
        self.n_items = check_int(n_items, "n_items", 0, MAX_ITEMS)
        what = f"an integer in [1, {_bound(MAX_ITEM_BYTES)}] bytes or an array of n_items={self.n_items} of them"
        sizes = _int_array(item_bytes, "item_bytes", what)
        # One size for every item (the usual neuron cache): requests' sizes are then a fill,
        # not a gather from an n_items-long array (a random read per request).
        self._one_size: int | None
        if sizes.ndim == 0:
            one = check_int(sizes[()], "item_bytes", 1, MAX_ITEM_BYTES)
            # a read-only view, not n_items copies (Mixtral's 3.7 M: 30 MB written per cache built)
            self.item_bytes = np.broadcast_to(np.int64(one), (self.n_items,))
            self._one_size = one if self.n_items else None
        else:
            if sizes.shape != (self.n_items,):
                raise SimError(f"must be a scalar or have n_items={self.n_items} entries, got shape {sizes.shape}",
                               field="item_bytes")
            if self.n_items and (sizes.min() < 1 or sizes.max() > MAX_ITEM_BYTES):
                raise SimError(f"every item must be an integer in [1, {_bound(MAX_ITEM_BYTES)}] bytes",
                               field="item_bytes")
            self.item_bytes = np.ascontiguousarray(sizes, dtype=np.int64)
            self._one_size = int(sizes[0]) if self.n_items and np.all(sizes == sizes[0]) else None
        self._scal = np.zeros(32, dtype=np.int64)
        self._scal[CAP] = self.capacity_bytes
        if self.item_arrays:
            self._res = np.zeros(self.n_items, dtype=np.uint8)
            self._size = np.zeros(self.n_items, dtype=np.int64)
            self._pin = np.full(self.n_items, -1, dtype=np.int64)
        self._evbuf = np.zeros(0, dtype=np.int64)
        self._auto_token = 0

    def size_bounds(self) -> tuple[int, int]:
        """(largest, smallest) item size in bytes (1 and 1 with no items): what a kernel's row
        width and its queue's length are chosen from."""
        if self._one_size is not None:
            return self._one_size, self._one_size
        if not self.n_items:
            return 1, 1
        return int(self.item_bytes.max()), int(self.item_bytes.min())

    # -- state -------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        """Bytes currently resident (never more than ``capacity_bytes``)."""
        return int(self._scal[USED])

    @property
    def steps_done(self) -> int:
        return int(self._scal[STEP])

    def resident_mask(self) -> np.ndarray:
        """Bool per item: resident now (ghost entries are not resident); policies with
        their own state layout override this."""
        return (self._res != 0) & (self._res < GHOST)

    def resident(self) -> np.ndarray:
        return np.flatnonzero(self.resident_mask())

    # -- the two entry points ---------------------------------------------------------
    def step(self, keys: np.ndarray, sizes: np.ndarray | None = None, *, token: int | None = None,
             next_use: np.ndarray | None = None, check: bool = True) -> StepResult:
        """Serve one step of unique keys; returns per-key hits and the evicted keys.

        ``sizes`` (bytes per key) default to the policy's ``item_bytes``; a missed key is
        inserted with the size given here. ``token`` (the token index the step belongs
        to) matters only to the sliding-window policy and defaults to a step counter.
        ``check=False`` skips the key validation for callers that guarantee it.
        """
        keys = self._as_keys(keys)
        if check:
            self._check_keys(keys)
        if sizes is None:
            sizes = self._sizes_of(keys)
        else:
            what = f"one integer byte count in [1, {_bound(MAX_ITEM_BYTES)}] per key"
            sizes = _int_array(sizes, "sizes", what).reshape(-1)
            if sizes.shape != keys.shape or (sizes.size and (sizes.min() < 1 or sizes.max() > MAX_ITEM_BYTES)):
                raise SimError(f"must be {what}", field="sizes")
            sizes = np.ascontiguousarray(sizes, dtype=np.int64)
        if next_use is not None:
            next_use = _int_array(next_use, "next_use", "an array of integer step indices, one per key")
        token = self._auto_token if token is None else check_int(token, "token", 0, MAX_TOKEN)
        self._auto_token = token + 1
        tokens = np.array([token], dtype=np.int64)
        offsets = np.array([0, keys.shape[0]], dtype=np.int64)
        out = self.run(keys, offsets, sizes=sizes, tokens=tokens, next_use=next_use, record_evictions=True)
        assert out.evicted is not None
        return StepResult(keys, out.hit, out.evicted, int(out.loaded_bytes.sum()))

    def run(self, items: np.ndarray, offsets: np.ndarray, *, sizes: np.ndarray | None = None,
            tokens: np.ndarray | None = None, next_use: np.ndarray | None = None,
            record_evictions: bool = False, check: bool = True, per_step: bool = False) -> RunResult:
        """Serve a block of steps given as CSR (``items[offsets[s]:offsets[s+1]]`` is step s).

        Keys must be unique within each step (not checked: this is the replay fast path);
        keys out of range and malformed step bounds are refused. ``tokens`` gives each
        step's token index (default: one token per step); ``next_use`` gives, per request,
        the index of the next step that requests the same key (only Belady reads it).
        ``check=False`` skips the key and bound checks, for the engine's strategies, which
        build both from a checked trace and call once per layer or token. ``per_step`` also
        reports, after each step, the evictions so far and the bytes resident
        (``evicted_ends``, ``used_ends``): what a caller booking each step's effect needs
        (LLM in a Flash's rows per layer), in one call for a whole token.
        """
        items = np.ascontiguousarray(items, dtype=np.int64).reshape(-1)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
        n_steps = offsets.shape[0] - 1
        # What the compiled kernels index by: out of range, they would read or write memory
        # that is not theirs (a crash of the interpreter, or a silently corrupt cache).
        if check and (n_steps < 0 or offsets[0] != 0 or offsets[-1] != items.shape[0] or np.any(np.diff(offsets) < 0)):
            raise SimError(f"must rise from 0 to len(items)={items.shape[0]} (CSR step bounds)", field="offsets")
        if check and items.size and (items.min() < 0 or items.max() >= self.n_items):
            raise SimError(f"keys must be in [0, n_items={self.n_items})", field="items")
        sizes = self._sizes_of(items) if sizes is None else np.ascontiguousarray(sizes, dtype=np.int64)
        if sizes.shape != items.shape:
            raise SimError(f"must give one size per key ({items.shape[0]})", field="sizes")
        if tokens is None:
            tokens = np.arange(self._auto_token, self._auto_token + n_steps, dtype=np.int64)
            self._auto_token += n_steps
        else:
            tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
            if tokens.shape[0] != n_steps:
                raise SimError(f"must give one token index per step ({n_steps})", field="tokens")
        if next_use is None:
            if self.needs_future:
                raise SimError(f"{self.name} is offline: it needs next-use times for every request",
                               field="next_use")
            next_use = _EMPTY
        else:
            next_use = np.ascontiguousarray(next_use, dtype=np.int64).reshape(-1)
            if next_use.shape != items.shape:
                raise SimError(f"must give one next-use step per key ({items.shape[0]})", field="next_use")
        # Every eviction undoes an insertion made before the block (at most n_items are
        # resident) or within it (at most one per request), so this bound cannot overflow.
        # Only the written prefix is ever read, so the buffer is left unfilled (its pages are
        # touched as evictions land: zeroing Mixtral's 30 MB took 36 ms a growth) and grows
        # with headroom (a token's steps in one block ask for a little more each time).
        need = self.n_items + items.shape[0] + 1
        if record_evictions and self._evbuf.shape[0] < need:
            self._evbuf = np.empty(need + need // 4, dtype=np.int64)
        if per_step:
            return self._run_steps(items, sizes, offsets, tokens, next_use, record_evictions)
        return self._run_block(items, sizes, offsets, tokens, next_use, record_evictions)

    def _run_steps(self, items: np.ndarray, sizes: np.ndarray, offsets: np.ndarray, tokens: np.ndarray,
                   next_use: np.ndarray, record: bool) -> RunResult:
        """The block one step at a time, exactly as one ``run`` per step, noting after each the
        evictions so far and the bytes resident (the kernels report neither per step)."""
        n_steps = offsets.shape[0] - 1
        hit = np.empty(items.shape[0], dtype=np.bool_)
        evicted_ends = np.zeros(n_steps, dtype=np.int64)
        used_ends = np.zeros(n_steps, dtype=np.int64)
        evicted: list[np.ndarray] = []
        n_ev = 0
        for s in range(n_steps):
            lo, hi = int(offsets[s]), int(offsets[s + 1])
            r = self._run_block(items[lo:hi], sizes[lo:hi], np.array([0, hi - lo], dtype=np.int64), tokens[s:s + 1],
                                next_use[lo:hi] if next_use.size else next_use, record)
            hit[lo:hi] = r.hit
            n_ev += r.n_evicted
            if r.evicted is not None:
                evicted.append(r.evicted)
            evicted_ends[s] = n_ev
            used_ends[s] = self.used_bytes
        keys = np.concatenate(evicted) if evicted else np.zeros(0, dtype=np.int64)
        return RunResult(hit, keys if record else None, n_ev, sizes=sizes, evicted_ends=evicted_ends,
                         used_ends=used_ends)

    def _run_block(self, items: np.ndarray, sizes: np.ndarray, offsets: np.ndarray, tokens: np.ndarray,
                   next_use: np.ndarray, record: bool) -> RunResult:
        hit = np.empty(items.shape[0], dtype=np.bool_)
        n_ev = int(self._run(items, sizes, offsets, tokens, next_use, hit, self._evbuf, record))
        evicted = self._evbuf[:n_ev].copy() if record else None
        return RunResult(hit, evicted, n_ev, sizes=sizes)

    @abstractmethod
    def _run(self, items: np.ndarray, sizes: np.ndarray, offsets: np.ndarray, tokens: np.ndarray,
             next_use: np.ndarray, hit: np.ndarray, evbuf: np.ndarray, record: bool) -> int:
        """Run the kernel; fill ``hit``; write evicted keys to ``evbuf`` if ``record``;
        return the number of evictions. (Composite policies override ``_run_block``.)"""

    def _sizes_of(self, keys: np.ndarray) -> np.ndarray:
        if self._one_size is not None:
            return np.full(keys.shape[0], self._one_size, dtype=np.int64)
        return self.item_bytes[keys]

    def _as_keys(self, keys: Any) -> np.ndarray:
        """The requested keys as a flat contiguous int64 array (integers only: no truncation)."""
        keys = _int_array(keys, "keys", f"an array of integer item keys in [0, n_items={self.n_items})")
        return np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)

    def _check_keys(self, keys: np.ndarray) -> None:
        if keys.size == 0:
            return
        if keys.min() < 0 or keys.max() >= self.n_items:
            raise SimError(f"keys must be in [0, n_items={self.n_items})", field="keys")
        if keys.size > 1 and not np.all(keys[1:] > keys[:-1]) and np.unique(keys).size != keys.size:
            raise SimError("keys must be unique within a step", field="keys")


_EMPTY = np.zeros(0, dtype=np.int64)

# -- registry ------------------------------------------------------------------------------
POLICIES: dict[str, type[CachePolicy]] = {}


def register(name: str, summary: str = ""):
    """Class decorator: make a policy available under its CLI name."""

    def deco(cls: type[CachePolicy]) -> type[CachePolicy]:
        if name in POLICIES and POLICIES[name] is not cls:
            raise ValueError(f"policy {name!r} registered twice")
        cls.name = name
        cls.summary = summary or (cls.__doc__ or "").strip().splitlines()[0]
        POLICIES[name] = cls
        return cls

    return deco


def policy_class(name: str, field: str = "policy") -> type[CachePolicy]:
    if not isinstance(name, str) or name not in POLICIES:
        raise SimError(f"unknown policy {_shown(name)}; available: {', '.join(POLICIES)}", field=field)
    return POLICIES[name]


def policy_options(cls: type[CachePolicy]) -> dict[str, Any]:
    """The keyword-only options a policy accepts, with their defaults."""
    sig = inspect.signature(cls.__init__)
    return {p.name: p.default for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def make_policy(name: str, capacity_bytes: int, n_items: int, item_bytes: int | np.ndarray = 1, *,
                strict: bool = True, **options: Any) -> CachePolicy:
    """Build a registered policy; with ``strict=False`` options it does not take are ignored
    (so one option set can be handed to every policy of a comparison)."""
    cls = policy_class(name, field="name")
    accepted = policy_options(cls)
    unknown = sorted(set(options) - set(accepted))
    if unknown and check_bool(strict, "strict"):
        allowed = ", ".join(accepted) or "none"
        raise SimError(f"{name} does not take option(s) {unknown}; it takes: {allowed}", field="options")
    kwargs = {k: v for k, v in options.items() if k in accepted}
    return cls(capacity_bytes, n_items, item_bytes, **kwargs)
