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
hidden state at once, so the new hot neurons fire at the first token that sees it. Each
pool's part of a shift is applied just before the pool's next step (or when the chunk
ends): every draw is keyed by the shift's token, so this is exact, and it works on state
the step is about to load anyway (with the shuffle's draws vectorised, generating a
Mixtral trace became ~25% faster).
"""

from __future__ import annotations

import numba as nb
import numpy as np

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


@nb.njit(cache=True)
def _step_chain(p, st, rg, s0):
    """One sticky-chain step for a pool: die w.p. ``rg (1 - p)``, be born w.p. ``rg p``."""
    for i in range(p.shape[0]):
        pp = p[i]
        a = st[i]
        thr = rg * (pp + a * (1.0 - 2.0 * pp))
        st[i] = np.uint8(_unit_at(s0, i) < thr) ^ a


_LO32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_INV32 = 1.0 / 4294967296.0


_S11_ = np.uint64(11)
_M21 = np.uint64(0x1FFFFF)
_M11 = np.uint64(0x7FF)
_INV21 = 1.0 / 2097152.0
_INV11 = 1.0 / 2048.0


@nb.njit(cache=True)
def _step_with_predictor(p, st, rg, z, zst, rz, recall, s0, keep):
    """Step the activity chain and the false-positive chain, and mark the predicted set.

    One 64-bit hash per neuron is split into three uniforms: 32 bits for the activity
    chain, 21 bits for the false-positive chain, 11 bits for the predictor's keep draw
    (probability resolution 2.3e-10, 4.8e-7 and 4.9e-4: far below any configured rate's
    precision). Branch-free, so the loop vectorises. Predicted = active and kept
    (probability ``recall``), or a false positive ``z & ~a``.
    """
    for i in range(p.shape[0]):
        h = _mix(s0 + np.uint64(i + 1) * _GOLDEN)
        ua = np.float64(np.int64(h >> _S32)) * _INV32
        uz = np.float64(np.int64((h >> _S11_) & _M21)) * _INV21
        uk = np.float64(np.int64(h & _M11)) * _INV11
        pp = p[i]
        a = st[i]
        a = np.uint8(ua < rg * (pp + a * (1.0 - 2.0 * pp))) ^ a
        st[i] = a
        pz = z[i]
        b = zst[i]
        b = np.uint8(uz < rz * (pz + b * (1.0 - 2.0 * pz))) ^ b
        zst[i] = b
        keep[i] = (a & np.uint8(uk < recall)) | ((a ^ np.uint8(1)) & b)


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


def _byte_mask_tables() -> tuple[np.ndarray, np.ndarray]:
    """For 8 state bytes (0/1) read as one little-endian word w, ``(w * _PACK) >> 56`` is an
    8-bit mask; ``_POSITIONS[mask]`` lists the set byte offsets and ``_COUNTS[mask]`` their
    number. Emitting ids 8 at a time this way is about twice as fast as byte by byte."""
    positions = np.zeros((256, 8), np.int32)
    counts = np.zeros(256, np.int64)
    for bits in range(256):
        word = sum(((bits >> j) & 1) << (8 * j) for j in range(8))
        mask = ((word * 0x8040201008040201) % 2**64) >> 56
        pos = [j for j in range(8) if (bits >> j) & 1]
        counts[mask] = len(pos)
        positions[mask, : len(pos)] = pos
    return positions, counts


_PACK = np.uint64(0x8040201008040201)
_S56 = np.uint64(56)
_POSITIONS, _COUNTS = _byte_mask_tables()


@nb.njit(cache=True)
def _emit(st, out, n):
    """Append the indices of the non-zero bytes of ``st`` (length a multiple of 8) to ``out``.

    ``out`` needs ``len(st)`` spare entries past ``n`` (8 are written per word regardless).
    """
    words = st.view(np.uint64)
    for w in range(words.shape[0]):
        mask = (words[w] * _PACK) >> _S56
        base = np.int32(w * 8)
        for j in range(8):
            out[n + j] = base + _POSITIONS[mask, j]
        n += _COUNTS[mask]
    return n


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
def _shuffle_share(p, z, grp, share, static_p, s_pick, s_shuffle, idx, uni, with_pred):
    """Pick each mobile neuron with probability ``share`` and shuffle the picked ones' propensities.

    Neurons with a propensity of at least ``static_p`` are static (hot in every context)
    and never picked; since only smaller propensities move, that stays the same set. The
    false-positive propensity and the co-activation group follow the propensity (both are
    functions of the neuron's rank), so they move with it. Returns how many were picked
    (their ids are ``idx[:m]``); ``uni`` is scratch for the shuffle's uniforms.

    The pick is branch-free and the uniforms are drawn in a loop of their own (it
    vectorises), which leaves only the swaps in the sequential loop: the same draws, and
    about 2.8x faster than drawing inside it.
    """
    m = 0
    for i in range(p.shape[0]):
        idx[m] = i
        m += np.int64((p[i] < static_p) & (_unit_at(s_pick, i) < share))
    for j in range(1, m):
        uni[j] = _unit_at(s_shuffle, j)
    for j in range(m - 1, 0, -1):  # Fisher-Yates over the picked positions
        k = int(uni[j] * (j + 1))
        a = idx[j]
        b = idx[k]
        p[a], p[b] = p[b], p[a]
        if with_pred:
            z[a], z[b] = z[b], z[a]
        if grp is not None:
            grp[a], grp[b] = grp[b], grp[a]
    return m


@nb.njit(cache=True)
def _shift_pool(t, layer, e, key, share, static_p, p_by_id, refresh, state, last_t, with_pred, z_by_id, z_refresh,
                z_state, recall, group_size, group_of_id, group_p, strength, keep, gev, idx, uni):
    """Apply the context shift of token ``t`` to pool ``(layer, e)`` (whose share is > 0).

    A pool routed before is first stepped to ``t`` under the propensities before the
    shift; then the picked neurons get new propensities and fresh states drawn from them
    (the new context's hot neurons are active at once), and ``last_t`` becomes ``t`` so
    the row emitted at ``t`` does not step it again. A pool never routed starts from its
    (new) propensities anyway. Every draw is keyed by (``t``, layer, expert), so applying
    it later, just before the pool's next step, gives the same result as at ``t``.
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
    s_pick = stream_seed(key, t, layer, e, STREAM_DRIFT_PICK)
    s_shuffle = stream_seed(key, t, layer, e, STREAM_DRIFT_SHUFFLE)
    if group_of_id is None:
        m = _shuffle_share(p, z, None, share[layer], static_p[layer], s_pick, s_shuffle, idx, uni, with_pred)
    else:
        m = _shuffle_share(p, z, group_of_id[layer, e], share[layer], static_p[layer], s_pick, s_shuffle, idx, uni,
                           with_pred)
    if last >= 0:
        s_state = stream_seed(key, t, layer, e, STREAM_DRIFT_STATE)
        for j in range(m):  # the picked neurons start afresh in the new context
            a = idx[j]
            h = _mix(s_state + np.uint64(j + 1) * _GOLDEN)
            st[a] = np.uint8(np.float64(np.int64(h >> _S32)) * _INV32 < p[a])
            if with_pred:
                zst[a] = np.uint8(np.float64(np.int64((h >> _S11_) & _M21)) * _INV21 < z[a])
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
                 drift_rate, drift_regular, drift_share, drift_static_p, active_count, cap_active, cap_pred):
    """Advance the neuron chains of the routed experts and emit CSR rows.

    Rows are produced in the format's (token, layer, slot) order straight into output
    buffers of ``cap_active`` / ``cap_pred`` entries, whose first ``n`` / ``m`` entries the
    caller keeps (no copy). Each row's ids come out sorted because neurons are visited in
    id order. A buffer that turns out too small is grown in place (so the chains' state
    never needs a snapshot to retry from). ``active_count[layer]`` accumulates realised
    activations for the density report. Context shifts (``drift_rate > 0``) rewrite
    ``p_by_id``, ``z_by_id`` and ``group_of_id`` in place.
    (A numba ``prange`` over layers was tried: on this shared 2-core machine it was slower.)
    """
    n_tok, n_layers, top_k = experts.shape
    n_neurons = state.shape[2]  # padded to a multiple of 8; the padding never activates
    n_rows = n_tok * n_layers * top_k
    offsets = np.zeros(n_rows + 1, np.int64)
    pred_offsets = np.zeros(n_rows + 1 if with_pred else 1, np.int64)
    ids = np.empty(cap_active, np.int32)
    pred_ids = np.empty(cap_pred if with_pred else 1, np.int32)
    keep = np.zeros(n_neurons, np.uint8)
    gev = np.zeros(max(group_p.shape[1], 1), np.uint8)
    idx = np.empty(p_by_id.shape[2] if drift_rate > 0.0 else 1, np.int64)
    uni = np.empty(idx.shape[0], np.float64)
    n = np.int64(0)  # not the literal 0: numba would compile _emit and _grown once more for it
    m = np.int64(0)
    row = 0
    # Context shifts are applied to a pool lazily, just before its next step (or at the end of
    # the chunk): the same draws, but on state the step is about to load anyway, instead of a
    # pass over every pool's tables at the shift.
    shifts = drift_events(key, t0, t0 + n_tok, drift_rate, drift_regular)
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
                        _shift_pool(shifts[k], layer, e, key, drift_share, drift_static_p, p_by_id, refresh, state,
                                    last_t, with_pred, z_by_id, z_refresh, z_state, recall, group_size, group_of_id,
                                    group_p, strength, keep, gev, idx, uni)
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
                _shift_pool(shifts[k], layer, e, key, drift_share, drift_static_p, p_by_id, refresh, state, last_t,
                            with_pred, z_by_id, z_refresh, z_state, recall, group_size, group_of_id, group_p,
                            strength, keep, gev, idx, uni)
    return offsets, ids, n, pred_offsets, pred_ids, m
