"""make_policy, the policy constructors and step(): every bad argument is a one-line SimError
naming it; numpy scalars are the numbers they are (identical results); booleans are not numbers."""

from __future__ import annotations

import numpy as np
import pytest
from arg_helpers import raises_on
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cache import POLICY_NAMES, make_policy
from sim.errors import SimError

COUNTS = np.array([5, 4, 3, 2, 1, 0, 0, 1])
N = COUNTS.size
NAN, INF = float("nan"), float("inf")


_raises = raises_on


# -- make_policy and the base arguments ------------------------------------------------------

@pytest.mark.parametrize("name", [["lru"], None, 3, b"lru", "nope"])
def test_bad_policy_name(name):
    assert "available: " in _raises("name", make_policy, name, 10, N)


@pytest.mark.parametrize("value", [1.5, 4.0, NAN, INF, None, "10", True, -1, 2**70, np.float64(3), [10]])
def test_bad_capacity_bytes(value):
    assert "[0, 2**62]" in _raises("capacity_bytes", make_policy, "lru", value, N)


@pytest.mark.parametrize("value", [1.5, NAN, None, "8", True, -1, 2**31, 2**40, np.float64(8)])
def test_bad_n_items(value):
    assert "[0, 2**31 - 1]" in _raises("n_items", make_policy, "lru", 10, value)


@pytest.mark.parametrize("value", [
    1.7, 1.0, NAN, None, "4", True, 0, -3, 2**41, 2**70, np.float32(2), np.bool_(True),
    np.full(N, 1.5), np.ones(N, dtype=bool), np.array(["4"] * N), np.arange(N),  # arange: a 0-byte item
    np.full(N, 2**41), np.full(N, 2**63, dtype=np.uint64), [[1, 2], [3]], np.ones(N + 1, dtype=np.int64),
])
@pytest.mark.parametrize("name", ["lru", "fifo", "window"])
def test_bad_item_bytes(name, value):
    _raises("item_bytes", make_policy, name, 10, N, item_bytes=value)


def test_bad_strict():
    _raises("strict", make_policy, "lru", 10, N, strict="no", window_tokens=3)


# -- policy options ----------------------------------------------------------------------------

BAD_OPTIONS = [
    ("s3fifo", "small_size_ratio", ["x", NAN, INF, True, None, 0, 1.0, 1.5, -0.1]),
    ("s3fifo", "ghost_size_ratio", ["x", NAN, INF, True, None, -0.5]),
    ("s3fifo", "move_to_main_threshold", [1.5, 2.0, "2", True, None, 0, NAN]),
    ("window", "window_tokens", [None, NAN, INF, 2.5, 2.0, "5", True, 0, -1, 2**70]),
    ("clock", "clock_bits", [1.5, "x", None, True, 0, 9, NAN]),
    ("belady", "bypass", ["no", 1, None, NAN]),
    ("static-hot", "preload", ["no", 1, None]),
    ("pi2-segmented", "hot_fraction", ["x", NAN, INF, None, True, -0.1, 1.5]),
    ("pi2-segmented", "cluster_neurons", [1.5, None, "32", True, 0, NAN]),
    ("pi2-segmented", "group_items", [1.5, "4", True, 0, NAN]),
    ("pi2-segmented", "hot_set_factor", [NAN, INF, "x", None, True, 0, -1.0]),
]


@pytest.mark.parametrize(("name", "option", "value"),
                         [(n, o, v) for n, o, values in BAD_OPTIONS for v in values])
def test_bad_policy_options(name, option, value):
    options = {option: value}
    if name in ("static-hot", "pi2-segmented"):
        options["profile_counts"] = COUNTS
    _raises(option, make_policy, name, 6, N, **options)


@pytest.mark.parametrize("name", ["static-hot", "pi2-segmented"])
@pytest.mark.parametrize("counts", [
    None, COUNTS.astype(float) * np.array([1, 1, NAN, 1, 1, 1, 1, 1]), COUNTS - 3, np.where(COUNTS > 2, INF, 0.0),
    COUNTS > 0, np.array(["a"] * N), COUNTS[:-1], "counts", [[1, 2], [3]],
])
def test_bad_profile_counts(name, counts):
    _raises("profile_counts", make_policy, name, 6, N, profile_counts=counts)


@pytest.mark.parametrize("name", ["static-hot", "pi2-segmented"])
def test_float_and_list_profile_counts_are_counts(name):
    for counts in (COUNTS.astype(np.float32), COUNTS.tolist(), COUNTS.astype(np.uint16)):
        ref = make_policy(name, 4, N, profile_counts=COUNTS)
        policy = make_policy(name, 4, N, profile_counts=counts)
        assert np.array_equal(policy.resident_mask(), ref.resident_mask())
        for keys in ([0, 1], [2, 5], [0, 7]):
            assert np.array_equal(policy.step(keys).hit, ref.step(keys).hit)


# -- step ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"keys": None}, "keys"), ({"keys": [1.5]}, "keys"), ({"keys": ["a"]}, "keys"), ({"keys": [True]}, "keys"),
    ({"keys": [[1], [1, 2]]}, "keys"), ({"keys": [N]}, "keys"), ({"keys": [-1]}, "keys"),
    ({"keys": [1], "token": "a"}, "token"), ({"keys": [1], "token": 1.5}, "token"),
    ({"keys": [1], "token": True}, "token"), ({"keys": [1], "token": -1}, "token"),
    ({"keys": [1], "token": 2**70}, "token"),
    ({"keys": [1], "sizes": [1.5]}, "sizes"), ({"keys": [1], "sizes": ["a"]}, "sizes"),
    ({"keys": [1], "sizes": [NAN]}, "sizes"), ({"keys": [1], "sizes": [0]}, "sizes"),
    ({"keys": [1], "sizes": [2**41]}, "sizes"), ({"keys": [1], "sizes": None, "next_use": ["a"]}, "next_use"),
])
def test_bad_step_arguments(name, kwargs, field):
    policy = make_policy(name, 6, N, strict=False, profile_counts=COUNTS)
    kwargs = dict(kwargs)
    if name == "belady":  # offline: give the future, so the step reaches the checks
        kwargs.setdefault("next_use", [0])
    _raises(field, policy.step, kwargs.pop("keys"), **kwargs)


def test_window_advance_checks_the_token():
    window = make_policy("window", 6, N)
    for token in ("a", 1.5, -2, True, 2**70):
        _raises("token", window.advance, token)
    assert window.advance(np.int64(3)).tolist() == []


def test_empty_steps_of_any_dtype_are_empty():
    policy = make_policy("lru", 6, N)
    assert policy.step([]).keys.tolist() == [] and policy.step(np.zeros(0)).keys.tolist() == []


# -- numpy scalars give the results of the Python numbers --------------------------------------

def _options(name, numpy):
    """Every policy's options, as Python numbers or as numpy scalars of assorted widths."""
    i = (lambda v, t=np.int64: t(v)) if numpy else (lambda v, t=None: v)
    f = (lambda v, t=np.float64: t(v)) if numpy else (lambda v, t=None: v)
    b = np.bool_ if numpy else bool
    return {
        "s3fifo": {"small_size_ratio": f(0.25, np.float32), "ghost_size_ratio": f(0.75),
                   "move_to_main_threshold": i(1, np.uint8)},
        "window": {"window_tokens": i(2, np.int16)},
        "clock": {"clock_bits": i(2, np.uint8)},
        "belady": {"bypass": b(True)},
        "static-hot": {"profile_counts": COUNTS, "preload": b(False)},
        "pi2-segmented": {"profile_counts": COUNTS, "hot_fraction": f(0.5, np.float32),
                          "cluster_neurons": i(2, np.int32), "group_items": i(4, np.uint64),
                          "hot_set_factor": f(1.5)},
    }.get(name, {})


def _replay(name, numpy, sizes):
    rng = np.random.default_rng(7)
    steps = [np.sort(rng.choice(N, size=rng.integers(1, 4), replace=False)) for _ in range(40)]
    cap = np.int32(9) if numpy else 9
    n = np.uint32(N) if numpy else N
    item_bytes = (sizes.astype(np.int16) if numpy else sizes) if sizes is not None else (np.int8(2) if numpy else 2)
    policy = make_policy(name, cap, n, item_bytes, **_options(name, numpy))
    if name == "belady":
        policy.prepare(np.concatenate(steps), np.cumsum([0] + [s.size for s in steps]))
    out = []
    for t, keys in enumerate(steps):
        token = np.int64(t) if numpy else t
        res = policy.step(keys.astype(np.int32) if numpy else keys, token=token)
        out.append((res.hit.tolist(), res.evicted.tolist(), res.loaded_bytes, policy.used_bytes))
    return out


@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("sizes", [None, np.array([1, 2, 3, 1, 2, 3, 1, 2])])
def test_numpy_scalars_give_identical_results(name, sizes):
    assert _replay(name, True, sizes) == _replay(name, False, sizes)


def test_numpy_scalars_are_stored_as_python_numbers():
    policy = make_policy("window", np.int64(10), np.int32(N), np.int16(2), window_tokens=np.uint8(3))
    assert type(policy.capacity_bytes) is int and type(policy.n_items) is int and type(policy.window_tokens) is int


def test_huge_ratios_mean_unbounded():
    """Finite but huge ratios are clamped where they multiply a capacity, not overflowed."""
    s3 = make_policy("s3fifo", 2**62, N, ghost_size_ratio=1e300)
    assert s3.step([1]).keys.tolist() == [1]
    pi2 = make_policy("pi2-segmented", 2**62, N, profile_counts=COUNTS, hot_set_factor=1e300)
    assert pi2.n_clusters >= 1


# -- anything at all: a policy or a SimError, nothing else ---------------------------------------

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=3), st.lists(st.integers(-3, 3), max_size=3),
                 st.sampled_from([np.int64(3), np.float32(0.5), np.bool_(True), np.uint64(2**63), np.nan]))


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(POLICY_NAMES), cap=JUNK, n=st.one_of(JUNK.filter(lambda v: not isinstance(v, int)),
                                                                 st.integers(-3, 12), st.just(2**31)), size=JUNK,
       option=st.sampled_from(["small_size_ratio", "ghost_size_ratio", "move_to_main_threshold", "window_tokens",
                               "clock_bits", "bypass", "preload", "hot_fraction", "cluster_neurons", "group_items",
                               "hot_set_factor"]),
       value=JUNK, keys=JUNK, token=JUNK)
def test_junk_is_a_policy_or_a_sim_error(name, cap, n, size, option, value, keys, token):
    try:
        policy = make_policy(name, cap, n, size, strict=False, profile_counts=COUNTS, **{option: value})
    except SimError as err:
        assert "\n" not in str(err) and err.field
        return
    assert isinstance(policy.capacity_bytes, int) and isinstance(policy.n_items, int)
    if name == "belady":
        return
    try:
        policy.step(keys, token=token)
    except SimError as err:
        assert "\n" not in str(err) and err.field in ("keys", "token")


def test_messages_name_the_allowed_range():
    assert "must be an integer in [1, 8], got 1.5" in _raises("clock_bits", make_policy, "clock", 6, N, clock_bits=1.5)
    msg = _raises("small_size_ratio", make_policy, "s3fifo", 6, N, small_size_ratio="x")
    assert "must be a finite number in (0, 1), got 'x'" in msg
    assert "got 2.0" in _raises("window_tokens", make_policy, "window", 6, N, window_tokens=np.float64(2))


def test_neuron_cache_arguments():
    """The per-(layer, expert) front end checks its arguments like the policies do."""
    from sim.cache.layout import CacheLayout
    from sim.cache.stepwise import StepwiseCache

    layout = CacheLayout(n_layers=2, n_experts=2, n_neurons=8, neuron_bytes=4)
    raises_on("capacity_bytes", StepwiseCache, layout, "lru", -1)
    cache = StepwiseCache(layout, "lru", np.int64(40))
    raises_on("layer", cache.step, 2, 0, [1, 2])
    raises_on("expert", cache.step, 0, -1, [1, 2])
    raises_on("neurons", cache.step, 0, 0, [1.5, 2.0])
    raises_on("neurons", cache.step, 0, 0, [8])
    first = cache.step(np.int64(1), np.int32(1), np.array([1, 2]))
    assert first.misses == 2 and cache.step(1, 1, [1, 2]).hits == 2


@pytest.mark.parametrize("name", ["lru", "fifo", "lfu", "clock", "s3fifo", "sieve", "arc", "window"])
@pytest.mark.parametrize(("items", "offsets", "field"), [
    ([10**7], [0, 1], "items"), ([-3], [0, 1], "items"), ([1, 2], [0, 50], "offsets"), ([1, 2], [1, 2], "offsets"),
    ([1, 2], [0, 2, 1], "offsets"),
])
def test_run_refuses_what_the_kernels_would_index_out_of_bounds(name, items, offsets, field):
    """run() is the replay fast path, but a key or step bound out of range crashed the
    interpreter (segfault) or corrupted the cache silently (a negative key)."""
    from sim.cache import make_policy

    pol = make_policy(name, 100, 10)
    with pytest.raises(SimError, match=f"^{field}: "):
        pol.run(np.array(items), np.array(offsets))
    assert pol.run(np.array([1, 2]), np.array([0, 2])).hit.tolist() == [False, False]  # still usable
