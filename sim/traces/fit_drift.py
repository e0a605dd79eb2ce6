"""Fit context drift (shifts of which neurons are hot) from a recorded trace.

How fast a static hot set goes stale gives ``rate * share`` of the generator's ``drift``
(the share of neurons re-drawn per token); how much reference windows disagree about it
(a few big shifts or many small ones) splits it. Used by :func:`sim.traces.fit.fit_params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.errors import SimError
from sim.traces.format import Trace

DRIFT_WINDOW = 16  # tokens whose most frequent neurons form a "static hot set"
DRIFT_JUMP_Z = 4.0  # a drop of this many robust SDs in a trailing hot set's coverage is a visible shift
DRIFT_BLOCK = 4  # tokens averaged after each trailing window (token-to-token noise is large)


@dataclass
class _LayerRows:
    """One layer's rows in token order: token, expert, and the CSR of neuron ids."""

    tok: np.ndarray  # int64 per row
    exp: np.ndarray  # int64 per row
    off: np.ndarray  # int64, rows + 1
    ids: np.ndarray  # int32 neuron ids
    row_of_id: np.ndarray  # int64 row (index into tok/exp) of each id


def _layer_rows(trace: Trace, predicted: bool = False) -> list[_LayerRows]:
    m = trace.meta
    parts: list[list[tuple[np.ndarray, ...]]] = [[] for _ in range(m.n_layers)]
    for ch in trace.chunks():
        off = ch.pred_offsets if predicted else ch.offsets
        ids = ch.pred_ids if predicted else ch.ids
        if off is None or ids is None:
            raise SimError("the trace has no predicted sets", field="predicted")
        r = np.arange(off.size - 1)
        tok = ch.start + r // (m.n_layers * m.top_k)
        layer = (r // m.top_k) % m.n_layers
        exp = ch.experts.reshape(-1).astype(np.int64)
        for lay in range(m.n_layers):
            rows = np.flatnonzero(layer == lay)
            lengths = off[rows + 1] - off[rows]
            ends = np.cumsum(lengths)
            index = np.arange(int(ends[-1]) if ends.size else 0) + np.repeat(off[rows] - (ends - lengths), lengths)
            parts[lay].append((tok[rows], exp[rows], lengths, ids[index]))
    out = []
    for lay in range(m.n_layers):
        tok, exp, lengths, ids = (np.concatenate([p[i] for p in parts[lay]]) for i in range(4))
        off = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        out.append(_LayerRows(tok, exp, off, ids.astype(np.int32), np.repeat(np.arange(lengths.size), lengths)))
    return out


def _hot_set(lr: _LayerRows, n_experts: int, n: int, t0: int, t1: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Per expert, the ``h`` neurons that fired most often in tokens [t0, t1), and which experts ran."""
    r0, r1 = np.searchsorted(lr.tok, [t0, t1])
    a, b = lr.off[r0], lr.off[r1]
    counts = np.bincount(lr.exp[lr.row_of_id[a:b]] * n + lr.ids[a:b], minlength=n_experts * n)
    counts = counts.reshape(n_experts, n)
    used = np.bincount(lr.exp[r0:r1], minlength=n_experts) > 0
    hot = np.zeros((n_experts, n), bool)
    top = np.argpartition(-counts, h - 1, axis=1)[:, :h]
    np.put_along_axis(hot, top, True, axis=1)
    hot[~used] = False
    return hot.reshape(-1), used


def _coverage(lr: _LayerRows, n: int, hot: np.ndarray, used: np.ndarray, t0: int, t1: int) -> np.ndarray:
    """Per token in [t0, t1): share of its active neurons (in experts that ran) inside ``hot``."""
    r0, r1 = np.searchsorted(lr.tok, [t0, t1])
    a, b = lr.off[r0], lr.off[r1]
    rows = lr.row_of_id[a:b]
    inside = hot[lr.exp[rows] * n + lr.ids[a:b]]
    ok = used[lr.exp[r0:r1]]
    covered = np.bincount(rows - r0, weights=inside, minlength=r1 - r0) * ok
    total = np.diff(lr.off[r0:r1 + 1]) * ok
    tok = lr.tok[r0:r1] - t0
    num = np.bincount(tok, weights=covered, minlength=t1 - t0)
    den = np.bincount(tok, weights=total, minlength=t1 - t0)
    return np.where(den > 0, num / np.maximum(den, 1), np.nan)


def hot_set_coverage(trace: Trace, *, window: int = DRIFT_WINDOW, max_distance: int | None = None,
                     block: int = DRIFT_BLOCK, predicted: bool = False,
                     rows: list[_LayerRows] | None = None) -> dict[str, Any]:
    """How well a static hot set keeps covering later tokens, and a trailing hot set's coverage.

    For reference windows of ``window`` tokens (every ``window // 4`` tokens), the hot set
    is each expert's ``h`` most frequent neurons in the window (``h`` = the layer's mean
    active neurons per row, so a random set of that size covers ``h / n_neurons``).
    ``coverage[layer, d - 1]`` is the mean share of the active neurons of the token ``d``
    tokens after the window that fall in it (``per_window[layer, i, d - 1]`` for the i-th
    window alone). Without drift it levels off once the chains forget the window (a few
    tokens); context shifts make it decay towards ``random``.
    ``trailing[layer, t]`` is the mean coverage of tokens ``t .. t + block - 1`` by the hot
    set of the ``window`` tokens just before ``t`` (NaN where undefined): a context shift
    shows as a sudden drop. (Real traces vary a lot from one token to the next, e.g. a
    comma against a noun; a short block average makes drops stand out.)
    """
    m = trace.meta
    n_tok, n = m.n_tokens, m.n_neurons
    if n_tok < window + 2:
        raise SimError(f"needs at least {window + 2} tokens, the trace has {n_tok}", field="window")
    lrs = rows if rows is not None else _layer_rows(trace, predicted)
    d_max = min(n_tok - window, max_distance or n_tok)
    stride = max(1, window // 4, (n_tok - window) // 64)
    coverage = np.full((m.n_layers, d_max), np.nan)
    starts = np.arange(0, n_tok - window, stride)
    per_window = np.full((m.n_layers, starts.size, d_max), np.nan)
    windows = np.zeros(d_max, np.int64)
    trailing = np.full((m.n_layers, n_tok), np.nan)
    random = np.zeros(m.n_layers)
    for lay, lr in enumerate(lrs):
        h = max(1, round(lr.ids.size / max(lr.tok.size, 1)))
        random[lay] = h / n
        acc, cnt = np.zeros(d_max), np.zeros(d_max)
        for j, s in enumerate(starts):
            hot, used = _hot_set(lr, m.n_experts, n, s, s + window, h)
            stop = min(n_tok, s + window + d_max)
            cov = _coverage(lr, n, hot, used, s + window, stop)
            per_window[lay, j, : cov.size] = cov
            ok = ~np.isnan(cov)
            acc[: cov.size][ok] += cov[ok]
            cnt[: cov.size][ok] += 1
            if lay == 0:
                windows[: cov.size] += 1
        coverage[lay] = np.where(cnt > 0, acc / np.maximum(cnt, 1), np.nan)
        for t in range(window, n_tok - block + 1):
            hot, used = _hot_set(lr, m.n_experts, n, t - window, t, h)
            cov = _coverage(lr, n, hot, used, t, t + block)
            if np.any(~np.isnan(cov)):
                trailing[lay, t] = float(np.nanmean(cov))
    return {"window": window, "block": block, "distance": np.arange(1, d_max + 1), "coverage": coverage,
            "windows": windows, "per_window": per_window, "random": random, "trailing": trailing}


def _wslope(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Weighted least-squares slope of y on x and its standard error."""
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    sxx = float(np.sum(w * (x - xm) ** 2))
    slope = float(np.sum(w * (x - xm) * (y - ym)) / sxx)
    resid = y - ym - slope * (x - xm)
    se = float(np.sqrt(np.sum(w * resid**2) / sxx / max(x.size - 2, 1)))
    return slope, se


def fit_drift(trace: Trace, *, refresh: float | np.ndarray = 1.0, window: int = DRIFT_WINDOW,
              coverage: dict[str, Any] | None = None) -> dict[str, Any]:
    """Estimate the context-shift parameters (``rate``, ``share``) of a trace.

    From :func:`hot_set_coverage`, layers averaged (a shift reaches all layers at once),
    per reference window ``i`` and bin of 8 distances: ``Y_i`` = coverage minus a random
    set's. Under the generator's model ``Y_i ~ g_i (1 - share) ** K_i`` with ``K_i`` the
    shifts since the window (Poisson, mean ``rate * d``) and ``g_i`` how good window
    ``i``'s estimate of the hot set was. Hence

    - ``log E[Y]`` falls with slope ``rate * share`` per token (``decay_per_token``), and
    - ``log(E[Y^2] / E[Y]^2)`` rises with slope ``rate * share ** 2``: few big shifts make
      windows disagree (some saw none, some a large one); many small ones do not.
      (Within-bin token noise is subtracted from ``E[Y^2]``.)

    so ``share`` is the ratio of the two slopes and ``rate = decay / share``. Fits use the
    distances past the chains' own memory (``refresh`` per use; a few tokens) while the
    mean is above a fifth of its start and at least a quarter of the windows reach them.
    The decay counts only if it exceeds three standard errors and 5% over that range;
    otherwise the trace shows no drift (rate 0). ``share`` is clipped to [0.02, 1]: below
    about 0.02 a trace cannot tell a slow drift from many tiny shifts.

    Also reported: ``n_events`` / ``event_tokens``, drops of the layer-averaged trailing
    hot set's coverage more than ``DRIFT_JUMP_Z`` robust SDs below its median (shifts big
    enough to see one by one). The standard errors treat bins as independent, which they
    are not (the same windows feed every bin), so they are on the small side.

    Accuracy on generated traces of 1,000 tokens (tests/traces/test_trace_fit.py): the
    decay matches the shifts that actually happened within ~10-30%; the split is coarser
    (share 0.5 comes out ~0.43, share 0.1 ~0.07-0.15). The split assumes randomly spaced
    (Poisson) shifts, which the fitted ``drift`` group then uses; regularly spaced ones
    make windows agree more and read as smaller shares.
    """
    m = trace.meta
    cov = coverage or hot_set_coverage(trace, window=window)
    bin_len = 8
    base = float(np.mean(cov["random"]))
    y = _nanmean0(cov["per_window"] - cov["random"][:, None, None])  # (windows, distances)
    n_bins = y.shape[1] // bin_len
    out: dict[str, Any] = {"decay_per_token": 0.0, "decay_se": float("nan"), "spread_slope": float("nan"),
                           "spread_se": float("nan"), "fit_distances": [0, 0], "random_coverage": base,
                           "share": 0.0, "share_upper": float("nan"), "rate": 0.0, "significant": False,
                           "n_events": 0, "event_tokens": []}
    uses_per_token = m.top_k / m.n_experts
    r_tok = float(np.clip(np.mean(refresh), 1e-3, 1.0)) * uses_per_token
    d0 = float(np.clip(np.ceil(np.log(0.05) / np.log(max(1.0 - r_tok, 1e-9))), 1, max(1, y.shape[1] // 3)))
    if n_bins >= 4:
        yb = y[:, : n_bins * bin_len].reshape(y.shape[0], n_bins, bin_len)
        full = ~np.isnan(yb).any(axis=2)
        cnt = full.sum(axis=0)
        mean_b = np.where(full, yb.mean(axis=2), 0.0)
        noise_b = np.where(full, yb.var(axis=2, ddof=1) / bin_len, 0.0) if bin_len > 1 else np.zeros_like(mean_b)
        m1 = mean_b.sum(0) / np.maximum(cnt, 1)
        m2 = (mean_b**2).sum(0) / np.maximum(cnt, 1) - noise_b.sum(0) / np.maximum(cnt, 1)
        dist = np.arange(n_bins) * bin_len + (bin_len + 1) / 2  # bin j holds distances j*8+1 .. j*8+8
        ok = (cnt >= max(8, 0.25 * cnt.max())) & (dist >= d0)
        sel = np.zeros(n_bins, bool)
        if ok.any():
            first = int(np.flatnonzero(ok)[0])
            for j in range(first, n_bins):
                if not (ok[j] and m1[j] > 0.2 * m1[first] and m2[j] > 0):
                    break
                sel[j] = True
        if sel.sum() >= 4 and m1[sel].min() > 0:
            x, w = dist[sel], cnt[sel].astype(np.float64)
            slope, se = _wslope(x, np.log(m1[sel]), w)
            spread, spread_se = _wslope(x, np.log(m2[sel] / m1[sel] ** 2), w)
            decay = max(0.0, -slope)
            out.update(decay_per_token=decay, decay_se=se, spread_slope=spread, spread_se=spread_se,
                       fit_distances=[int(x[0] - (bin_len - 1) / 2), int(x[-1] + (bin_len - 1) / 2)])
            out["significant"] = bool(decay > 3 * se and decay * float(x[-1] - x[0]) > 0.05)
            if out["significant"]:
                share = float(np.clip(spread / decay, 0.02, 1.0))
                out.update(share=share, share_upper=float(np.clip((spread + 2 * spread_se) / decay, 0.02, 1.0)),
                           rate=float(min(decay / share, 0.999)))
    series = _nanmean0(cov["trailing"])
    valid = np.flatnonzero(~np.isnan(series))
    if valid.size >= 8:
        vals = series[valid]
        med = float(np.median(vals))
        mad = 1.4826 * float(np.median(np.abs(vals - med)))
        low = (med - vals) > DRIFT_JUMP_Z * max(mad, 1e-12)
        starts = np.flatnonzero(low & ~np.concatenate(([False], low[:-1])))
        out.update(n_events=int(starts.size), event_tokens=valid[starts].tolist())
    return out


def _nanmean0(a: np.ndarray) -> np.ndarray:
    """Mean over axis 0 ignoring NaN; NaN where a column has no value (without a warning)."""
    ok = ~np.isnan(a)
    cnt = ok.sum(axis=0)
    return np.where(cnt > 0, np.where(ok, a, 0.0).sum(axis=0) / np.maximum(cnt, 1), np.nan)
