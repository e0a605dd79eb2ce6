"""Compiled inner loops of the synthetic trace generator (numba).

Randomness is counter-based: every (token, layer, expert, stream) gets its own splitmix64
stream derived from one 64-bit key drawn from the caller's ``numpy.random.Generator``.
Results therefore depend only on the seed and the token index, never on how the tokens
are split into chunks, which is what lets the engine generate a trace on the fly and get
exactly the arrays that ``sim trace synth`` writes to a file.

Per neuron the generator runs a two-state Markov chain in its "sticky" form: with
probability ``1 - r`` the neuron keeps its state, otherwise it is redrawn from its
propensity ``p``. Its stationary probability is ``p`` and its lag-1 autocorrelation
``1 - r``. A gap of ``g`` tokens (an expert not routed in between) is the same chain with
``r_g = 1 - (1 - r) ** g``, so experts that sit idle are caught up lazily and exactly.

Context shifts (``drift``): at token ``t`` a shift happens with probability ``rate`` (one
draw per token for the whole model, or one shift per ``1 / rate`` tokens at a random
position: see :func:`drift_event`). Every pool first steps its chains to ``t`` under the
old propensities (so the lazy catch-up stays exact), then a random ``share`` of its
mobile neurons (all but the static hottest ones) trade propensities by a uniform
shuffle: the set of propensity values, hence the density and the skew, is unchanged,
but a different set of neurons is hot. The shuffled
neurons' states are drawn afresh from their new propensities: a topic change changes the
hidden state at once, so the new hot neurons fire at the first token that sees it. With a
``duration`` a shift is an excursion: that many tokens later the same neurons trade their
propensities back (the inverse of the same keyed permutation) and draw fresh states again,
so the prompt's context, and the hot set an offline profile or a cache learnt, returns. Each
pool's part of a shift is applied just before the pool's next step (or when the chunk
ends): every draw is keyed by the shift's token, so this is exact, and it works on state
the step is about to load anyway (with the shuffle's draws vectorised, generating a
Mixtral trace became ~25% faster).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0

STREAM_NEURONS = 1
STREAM_GROUPS = 2
STREAM_ROUTING = 3
STREAM_FALSE_POS = 4
STREAM_KEEP = 5
STREAM_DRIFT_EVENT = 6
STREAM_DRIFT_PICK = 7
STREAM_DRIFT_SHUFFLE = 8
STREAM_CATCH_UP = 9
STREAM_CATCH_UP_GROUPS = 10
STREAM_CATCH_UP_FALSE_POS = 11
STREAM_DRIFT_STATE = 12
STREAM_DRIFT_UNDO_STATE = 13


@nb.njit(inline="always", cache=True)
def _mix(z: np.uint64) -> np.uint64:
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@nb.njit(inline="always", cache=True)
def _unit(z: np.uint64) -> float:
    return np.float64(_mix(z) >> _S11) * _INV53


@nb.njit(inline="always", cache=True)
def stream_seed(key: np.uint64, t: int, layer: int, expert: int, stream: int) -> np.uint64:
    s = _mix(key ^ (np.uint64(t) * _GOLDEN))
    s = _mix(s ^ (np.uint64(layer + 1) * _M1))
    s = _mix(s ^ (np.uint64(expert + 1) * _M2))
    return _mix(s ^ np.uint64(stream))


@nb.njit(cache=True, nogil=True)
def route_chunk(t0, n_tok, key, pop, persistence, prev, has_prev, out):
    """Fill ``out[t, layer, :]`` with distinct experts for tokens ``t0 .. t0 + n_tok - 1``.

    With probability ``persistence[layer]`` a token keeps the previous token's expert set;
    otherwise a fresh set is drawn by systematic sampling over a random order of experts,
    which includes expert ``e`` with probability exactly ``top_k * pop[layer, e]``. Both
    branches keep that marginal, so the configured popularity is exact in expectation.
    """
    n_layers, n_experts = pop.shape
    top_k = out.shape[2]
    order = np.empty(n_experts, np.int64)
    for i in range(n_tok):
        t = t0 + i
        for layer in range(n_layers):
            s = stream_seed(key, t, layer, 0, STREAM_ROUTING)
            s += _GOLDEN
            u = _unit(s)
            if has_prev[layer] and u < persistence[layer]:
                for j in range(top_k):
                    out[i, layer, j] = prev[layer, j]
                continue
            for e in range(n_experts):
                order[e] = e
            for e in range(n_experts - 1, 0, -1):  # Fisher-Yates
                s += _GOLDEN
                j = int(_unit(s) * (e + 1))
                order[e], order[j] = order[j], order[e]
            s += _GOLDEN
            point = _unit(s)
            cum = 0.0
            slot = 0
            for idx in range(n_experts):
                e = order[idx]
                cum += top_k * pop[layer, e]
                while slot < top_k and point + slot < cum:
                    out[i, layer, slot] = e
                    slot += 1
            while slot < top_k:  # rounding at the very end of the cumulative sum
                for idx in range(n_experts - 1, -1, -1):
                    e = order[idx]
                    dup = False
                    for j in range(slot):
                        if out[i, layer, j] == e:
                            dup = True
                    if not dup:
                        out[i, layer, slot] = e
                        break
                slot += 1
            for j in range(top_k):
                prev[layer, j] = out[i, layer, j]
            has_prev[layer] = True


@nb.njit(inline="always", cache=True)
def _unit_at(s0: np.uint64, i: int) -> float:
    """The i-th uniform of stream ``s0`` (counter-based, so loops over i vectorise)."""
    return np.float64(np.int64(_mix(s0 + np.uint64(i + 1) * _GOLDEN) >> _S11)) * _INV53


# Exact shortcuts in the per-neuron loops (each gives the very same bits as the plain form):
# - a uniform is ``k * 2**-b`` for a b-bit integer ``k``, so ``u < rg * x`` is ``k < (rg * 2**b) * x``:
#   scaling by a power of two is exact and commutes with rounding (no product here is subnormal:
#   ``rg`` is 0 or >= 2**-53, ``x`` 0 or >= 2**-149), which saves a multiply per draw;
# - ``x = p + a * (1 - 2 p)`` for a state ``a`` in {0, 1} is a select: ``p + (1 - 2 p)`` or ``p``
#   (``p + 0 * y`` is ``p``), which saves converting the state byte to a float;
# - ``k * 2**-11 < recall`` for an integer ``k`` is ``k < ceil(recall * 2**11)``: an integer compare.
_TWO53 = 9007199254740992.0
_TWO32 = 4294967296.0
_TWO21 = 2097152.0
_TWO11 = 2048.0
_S32 = np.uint64(32)
_S11_ = np.uint64(11)
_M21 = np.uint64(0x1FFFFF)
_M11 = np.uint64(0x7FF)
_INV32 = 1.0 / _TWO32
_INV21 = 1.0 / _TWO21


@nb.njit(inline="always", cache=True)
def _key_at(s0: np.uint64, i: int) -> float:
    """The i-th uniform of stream ``s0`` times 2**53 (its 53-bit integer, as a float: exact)."""
    return np.float64(np.int64(_mix(s0 + np.uint64(i + 1) * _GOLDEN) >> _S11))


@nb.njit(cache=True, boundscheck=False)
def _step_chain(p, st, rg, s0):
    """One sticky-chain step for a pool: die w.p. ``rg (1 - p)``, be born w.p. ``rg p``."""
    rgs = rg * _TWO53
    for i in range(p.shape[0]):
        pp = np.float64(p[i])
        a = st[i]
        x = pp + (1.0 - 2.0 * pp) if a else pp
        st[i] = np.uint8(_key_at(s0, i) < rgs * x) ^ a


@nb.njit(cache=True, boundscheck=False)
def _step_with_predictor(p, st, rg, z, zst, rz, recall, s0, keep):
    """Step the activity chain and the false-positive chain, and mark the predicted set.

    One 64-bit hash per neuron is split into three uniforms: 32 bits for the activity
    chain, 21 bits for the false-positive chain, 11 bits for the predictor's keep draw
    (probability resolution 2.3e-10, 4.8e-7 and 4.9e-4: far below any configured rate's
    precision). Branch-free, so the loop vectorises. Predicted = active and kept
    (probability ``recall``), or a false positive ``z & ~a``.
    """
    rgs = rg * _TWO32
    rzs = rz * _TWO21
    kept = np.uint64(np.ceil(max(recall, 0.0) * _TWO11))
    for i in range(p.shape[0]):
        h = _mix(s0 + np.uint64(i + 1) * _GOLDEN)
        pp = np.float64(p[i])
        a = st[i]
        x = pp + (1.0 - 2.0 * pp) if a else pp
        a = np.uint8(np.float64(np.int64(h >> _S32)) < rgs * x) ^ a
        st[i] = a
        pz = np.float64(z[i])
        b = zst[i]
        y = pz + (1.0 - 2.0 * pz) if b else pz
        b = np.uint8(np.float64(np.int64((h >> _S11_) & _M21)) < rzs * y) ^ b
        zst[i] = b
        keep[i] = (a & np.uint8((h & _M11) < kept)) | ((a ^ np.uint8(1)) & b)


@nb.njit(cache=True)
def _step_chain_groups(p, st, rg, s0, s_groups, group_of_id, group_p, strength, gev):
    """As :func:`_step_chain`, with births partly driven by shared group events."""
    for g in range(group_p.shape[0]):
        gev[g] = 1 if _unit_at(s_groups, g) < strength * rg * group_p[g] else 0
    for i in range(p.shape[0]):
        pp = p[i]
        u = _unit_at(s0, i)
        if st[i]:
            st[i] = 0 if u < rg * (1.0 - pp) else 1
        else:
            g = group_of_id[i]
            b = strength * rg * group_p[g]
            st[i] = 1 if gev[g] or u < 1.0 - (1.0 - rg * pp) / (1.0 - b) else 0


_ORDER = np.uint64(0x0102040810204080)  # 8 bytes of 0/1 read as a word, times this, >> 56: byte j -> bit j
_S56 = np.uint64(56)
_ONE = np.uint64(1)


@nb.njit(inline="always", cache=True)
def _mask64(words, w0, n_words):
    """The bytes (0/1) of ``words[w0 : w0 + n_words]`` (n_words <= 8) as one 64-bit mask, byte i -> bit i."""
    mask = np.uint64(0)
    for j in range(n_words):
        mask |= ((words[w0 + j] * _ORDER) >> _S56) << np.uint64(8 * j)
    return mask


@nb.njit(inline="always", cache=True)
def _put_bits(mask, base, out, n):
    """Write ``base + i`` for every set bit ``i`` of ``mask`` to ``out[n:]`` (ascending); returns the new ``n``."""
    while mask:
        out[n] = base + np.int32(trailing_zeros(mask))
        n += _ONE
        mask &= mask - _ONE
    return n


@nb.njit(cache=True, boundscheck=False)
def _emit(st, out, n):
    """Append the indices of the non-zero bytes of ``st`` (length a multiple of 8) to ``out``.

    64 state bytes become one bit mask (8 words, a multiply each), whose set bits are
    written with count-trailing-zeros: ~3x faster than a lookup table per byte word at the
    densities of the presets (and still faster at 95%). ``out`` needs ``len(st)`` spare
    entries past ``n``.
    """
    words = st.view(np.uint64)
    n_words = words.shape[0]
    full = n_words - n_words % 8
    k = np.uint64(n)
    for w in range(0, full, 8):
        k = _put_bits(_mask64(words, w, 8), np.int32(8 * w), out, k)
    if full < n_words:
        k = _put_bits(_mask64(words, full, n_words - full), np.int32(8 * full), out, k)
    return np.int64(k)


@nb.njit(cache=True)
def _mark_predicted(st, zst, recall, s0, keep):
    """Predicted = active kept with probability ``recall``, plus false positives ``z & ~a``."""
    for i in range(st.shape[0]):
        a = st[i]
        k = np.uint8(_unit_at(s0, i) < recall)
        keep[i] = (a & k) | ((a ^ np.uint8(1)) & zst[i])


@nb.njit(cache=True)
def drift_event(key, t, rate, regular):
    """Whether a context shift happens at token ``t`` (a pure function of the key and ``t``).

    ``regular = False``: independently at every token with probability ``rate`` (shift
    counts are Poisson). ``regular = True``: one shift in each block of ``1 / rate``
    tokens, at a uniform position within it (the same rate, but segments of similar
    length, as sentences and paragraphs have, and far less run-to-run scatter in how many
    shifts a short run sees).
    """
    if rate <= 0.0:
        return False
    if not regular:
        return _unit(stream_seed(key, t, 0, 0, STREAM_DRIFT_EVENT)) < rate
    b0 = np.int64(np.floor(t * rate))
    b1 = np.int64(np.floor((t + 1) * rate))
    for b in range(b0, b1 + 1):  # the blocks whose event could fall on t
        if b < 0:
            continue
        at = np.int64(np.floor((b + _unit(stream_seed(key, b, 0, 0, STREAM_DRIFT_EVENT))) / rate))
        if at == t:
            return True
    return False


@nb.njit(cache=True)
def drift_events(key, t0, t1, rate, regular):
    """The tokens in ``[t0, t1)`` at which a context shift happens."""
    out = np.empty(max(t1 - t0, 0), np.int64)
    m = 0
    for t in range(t0, t1):
        if drift_event(key, t, rate, regular):
            out[m] = t
            m += 1
    return out[:m]


@nb.njit(cache=True)
def drift_schedule(key, t0, t1, rate, regular, duration):
    """The context-shift events in ``[t0, t1)``: when each applies, the token its draws are
    keyed by, and whether it undoes that token's shift (an excursion ``duration`` tokens long
    ending; ``duration`` 0: shifts last for good).

    Built token by token, the end of an excursion before a shift at the same token, so the
    order is fixed and every chunking of the tokens sees the same events.
    """
    at = np.empty(2 * max(t1 - t0, 0), np.int64)
    drawn = np.empty_like(at)
    undo = np.zeros(at.shape[0], np.bool_)
    m = 0
    for t in range(t0, t1):
        if duration > 0 and t - duration >= 0 and drift_event(key, t - duration, rate, regular):
            at[m], drawn[m], undo[m] = t, t - duration, True
            m += 1
        if drift_event(key, t, rate, regular):
            at[m], drawn[m] = t, t
            m += 1
    return at[:m], drawn[:m], undo[:m]


@nb.njit(cache=True, boundscheck=False)
def _shift_pool(t, drawn, undo, layer, e, key, share, static_p, p_by_id, refresh, state, last_t, with_pred, z_by_id,
                z_refresh, z_state, recall, group_size, group_of_id, group_p, strength, keep, gev, scratch, flags,
                ints):
    """Apply the context-shift event at token ``t`` to pool ``(layer, e)`` (whose share is > 0):
    the shift drawn at token ``drawn`` (``t`` itself), or with ``undo`` its inverse, which ends
    that excursion.

    A pool routed before is first stepped to ``t`` under the propensities before the
    shift. Then each mobile neuron is picked with probability ``share`` and the picked
    ones' propensities are shuffled: neurons with a propensity of at least ``static_p``
    are static (hot in every context) and never picked; since only smaller propensities
    move, that stays the same set. The false-positive propensity and the co-activation
    group follow the propensity (both are functions of the neuron's rank), so they move
    with it. The picked neurons get fresh states drawn from their new propensities (the
    new context's hot neurons are active at once), and ``last_t`` becomes ``t`` so the row
    emitted at ``t`` does not step it again. A pool never routed starts from its (new)
    propensities anyway. Every draw is keyed by (``t``, layer, expert), so applying it
    later, just before the pool's next step, gives the same result as at ``t``. The pick
    depends only on the static set, which no shift moves, so an undo keyed by ``drawn``
    picks the same neurons and applies the inverse permutation: with no other shift in
    between the pool's propensities are back where they were.

    The draws are those of a Fisher-Yates shuffle of the picked neurons' values in place,
    done faster: the pick is a branch-free loop (it vectorises) whose flags become ids as
    emitted rows do; the shuffle's uniforms and swap targets are drawn in a loop of their
    own; the swaps permute a compact array of positions (in L1 cache) once, and each table
    then moves with one gather and one scatter (a swap sequence applied to the identity
    gives ``perm`` with ``new[j] = old[perm[j]]``), the fresh states drawn in the scatter.
    ``scratch`` (float64, 2 x neurons), ``flags`` (uint8, zero past the pool's neurons, a
    multiple of 8 long) and ``ints`` (int32, 3 x neurons) are scratch.
    """
    last = last_t[layer, e]
    st = state[layer, e]
    zst = z_state[layer, e] if with_pred else z_state[0, 0]
    p = p_by_id[layer, e]
    z = z_by_id[layer, e] if with_pred else z_by_id[0, 0]
    if last >= 0:  # catch up to t under the propensities before the shift
        gap = t - last
        rg = 1.0 - (1.0 - refresh[layer]) ** gap
        rz = 1.0 - (1.0 - z_refresh[layer]) ** gap
        s0 = stream_seed(key, t, layer, e, STREAM_CATCH_UP)
        if group_of_id is not None:
            _step_chain_groups(p, st, rg, s0, stream_seed(key, t, layer, e, STREAM_CATCH_UP_GROUPS),
                               group_of_id[layer, e], group_p[layer], strength, gev)
            if with_pred:
                _step_chain(z, zst, rz, stream_seed(key, t, layer, e, STREAM_CATCH_UP_FALSE_POS))
        elif with_pred:
            _step_with_predictor(p, st, rg, z, zst, rz, recall[layer], s0, keep)
        else:
            _step_chain(p, st, rg, s0)
    s_pick = stream_seed(key, drawn, layer, e, STREAM_DRIFT_PICK)
    s_shuffle = stream_seed(key, drawn, layer, e, STREAM_DRIFT_SHUFFLE)
    s_state = stream_seed(key, t, layer, e, STREAM_DRIFT_UNDO_STATE if undo else STREAM_DRIFT_STATE)
    share_l = share[layer]
    static_l = static_p[layer]
    for i in range(p.shape[0]):
        flags[i] = np.uint8((p[i] < static_l) & (_unit_at(s_pick, i) < share_l))
    idx, swap, perm = ints[0], ints[1], ints[2]
    m = _emit(flags, idx, np.int64(0))
    for j in range(1, m):
        swap[j] = np.int32(_unit_at(s_shuffle, j) * (j + 1))
    for j in range(m):
        perm[j] = j
    for j in range(m - 1, 0, -1):  # Fisher-Yates over the picked positions
        k = swap[j]
        perm[j], perm[k] = perm[k], perm[j]
    if undo:  # the inverse permutation: new[perm[j]] = old[j]
        for j in range(m):
            swap[perm[j]] = j
        for j in range(m):
            perm[j] = swap[j]
    old_p, old_z = scratch[0], scratch[1]
    for j in range(m):
        old_p[j] = p[idx[j]]
    if with_pred:
        for j in range(m):
            old_z[j] = z[idx[j]]
    if group_of_id is not None:
        grp = group_of_id[layer, e]
        old_g = swap  # the swap targets are used up
        for j in range(m):
            old_g[j] = grp[idx[j]]
        for j in range(m):
            grp[idx[j]] = old_g[perm[j]]
    fresh = last >= 0  # the picked neurons start afresh in the new context
    for j in range(m):
        a = idx[j]
        q = perm[j]
        h = _mix(s_state + np.uint64(j + 1) * _GOLDEN)
        vp = old_p[q]
        p[a] = vp
        if fresh:
            st[a] = np.uint8(np.float64(np.int64(h >> _S32)) * _INV32 < vp)
        if with_pred:
            vz = old_z[q]
            z[a] = vz
            if fresh:
                zst[a] = np.uint8(np.float64(np.int64((h >> _S11_) & _M21)) * _INV21 < vz)
    if fresh:
        last_t[layer, e] = t


@nb.njit(cache=True)
def _grown(buf, used, need):
    """A copy of ``buf[:used]`` in a buffer of at least ``need`` entries (doubling)."""
    out = np.empty(max(need, 2 * buf.shape[0]), buf.dtype)
    for i in range(used):  # a loop: a slice copy makes numba compile its shape-mismatch message (seconds)
        out[i] = buf[i]
    return out


@nb.njit(cache=True, nogil=True)
def neuron_chunk(t0, key, experts, p_by_id, refresh, state, last_t,
                 with_pred, z_by_id, z_refresh, z_state, recall,
                 group_size, group_of_id, group_p, strength,
                 drift_rate, drift_regular, drift_duration, drift_share, drift_static_p, active_count, ids,
                 pred_ids):
    """Advance the neuron chains of the routed experts and emit CSR rows.

    Rows are produced in the format's (token, layer, slot) order straight into the output
    buffers ``ids`` / ``pred_ids`` (int32, allocated by the caller: numpy asks the kernel
    for huge pages for big arrays, which makes first touching them several times cheaper
    than for numba's own allocations), whose first ``n`` / ``m`` entries the caller keeps
    (no copy). Each row's ids come out sorted because neurons are visited in id order. A
    buffer that turns out too small is grown (so the chains' state never needs a
    snapshot to retry from), and the grown one is returned. ``active_count[layer]`` accumulates realised
    activations for the density report. Context shifts (``drift_rate > 0``) rewrite
    ``p_by_id``, ``z_by_id`` and ``group_of_id`` in place.
    (A numba ``prange`` over layers was tried: on this shared 2-core machine it was slower.)
    """
    n_tok, n_layers, top_k = experts.shape
    n_neurons = state.shape[2]  # padded to a multiple of 8; the padding never activates
    n_rows = n_tok * n_layers * top_k
    offsets = np.zeros(n_rows + 1, np.int64)
    pred_offsets = np.zeros(n_rows + 1 if with_pred else 1, np.int64)
    keep = np.zeros(n_neurons, np.uint8)
    gev = np.zeros(max(group_p.shape[1], 1), np.uint8)
    n_drift = p_by_id.shape[2] if drift_rate > 0.0 else 1  # scratch of the context shifts
    scratch = np.empty((2, n_drift), np.float64)
    flags = np.zeros(n_neurons if drift_rate > 0.0 else 8, np.uint8)
    ints = np.empty((3, n_drift), np.int32)
    n = np.int64(0)  # not the literal 0: numba would compile _emit and _grown once more for it
    m = np.int64(0)
    row = 0
    # Context shifts are applied to a pool lazily, just before its next step (or at the end of
    # the chunk): the same draws, but on state the step is about to load anyway, instead of a
    # pass over every pool's tables at the shift.
    shifts, drawn, undo = drift_schedule(key, t0, t0 + n_tok, drift_rate, drift_regular, drift_duration)
    next_shift = np.zeros(last_t.shape, np.int64)  # per pool, its first shift not yet applied
    for i in range(n_tok):
        t = t0 + i
        for layer in range(n_layers):
            for slot in range(top_k):
                if n + n_neurons > ids.shape[0]:  # a rare fluctuation: grow the buffer
                    ids = _grown(ids, n, n + n_neurons)
                if with_pred and m + n_neurons > pred_ids.shape[0]:
                    pred_ids = _grown(pred_ids, m, m + n_neurons)
                e = np.int64(experts[i, layer, slot])
                k = next_shift[layer, e]
                while k < shifts.shape[0] and shifts[k] <= t:
                    if drift_share[layer] > 0.0:
                        _shift_pool(shifts[k], drawn[k], undo[k], layer, e, key, drift_share, drift_static_p,
                                    p_by_id, refresh, state, last_t, with_pred, z_by_id, z_refresh, z_state, recall,
                                    group_size, group_of_id, group_p, strength, keep, gev, scratch, flags, ints)
                    k += 1
                next_shift[layer, e] = k
                last = last_t[layer, e]
                if last < 0:
                    rg = 1.0
                    rz = 1.0
                else:
                    gap = t - last
                    rg = 1.0 - (1.0 - refresh[layer]) ** gap
                    rz = 1.0 - (1.0 - z_refresh[layer]) ** gap
                last_t[layer, e] = t
                st = state[layer, e]
                zst = z_state[layer, e] if with_pred else z_state[0, 0]
                if group_of_id is not None:
                    _step_chain_groups(p_by_id[layer, e], st, rg, stream_seed(key, t, layer, e, STREAM_NEURONS),
                                       stream_seed(key, t, layer, e, STREAM_GROUPS), group_of_id[layer, e],
                                       group_p[layer], strength, gev)
                    if with_pred:  # the false-positive chain and keep draws, after the grouped step
                        _step_chain(z_by_id[layer, e], zst, rz, stream_seed(key, t, layer, e, STREAM_FALSE_POS))
                        _mark_predicted(st, zst, recall[layer], stream_seed(key, t, layer, e, STREAM_KEEP), keep)
                elif with_pred:
                    _step_with_predictor(p_by_id[layer, e], st, rg, z_by_id[layer, e], zst, rz, recall[layer],
                                         stream_seed(key, t, layer, e, STREAM_NEURONS), keep)
                else:
                    _step_chain(p_by_id[layer, e], st, rg, stream_seed(key, t, layer, e, STREAM_NEURONS))
                n0 = n
                n = _emit(st, ids, n)
                active_count[layer] += n - n0
                if with_pred:
                    m = _emit(keep, pred_ids, m)
                row += 1
                offsets[row] = n
                if with_pred:
                    pred_offsets[row] = m
    for layer in range(n_layers):  # the shifts of pools not routed since: the chunk ends on the same state
        if drift_share[layer] <= 0.0:
            continue
        for e in range(last_t.shape[1]):
            for k in range(next_shift[layer, e], shifts.shape[0]):
                _shift_pool(shifts[k], drawn[k], undo[k], layer, e, key, drift_share, drift_static_p, p_by_id,
                            refresh, state, last_t, with_pred, z_by_id, z_refresh, z_state, recall, group_size,
                            group_of_id, group_p, strength, keep, gev, scratch, flags, ints)
    return offsets, ids, n, pred_offsets, pred_ids, m
