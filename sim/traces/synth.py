"""Statistical activation-trace generator at full model scale.

Nobody can run TurboSparse-Mixtral-47B in numpy on a laptop, yet its traces drive the main
prediction, so this module writes traces with the same format as the recorder from a
small parameter set (:mod:`sim.traces.params`), fitted to a recorded trace
(:mod:`sim.traces.fit`) or set from published figures (the bundled presets).

Model, per layer and per expert pool of ``n_neurons`` neurons:

- Neuron ``i`` has a propensity ``p_i``: ranks are spread evenly over the propensity
  distribution (a stratified draw, ``u = (rank + 0.5) / n``) and assigned to neuron ids by
  a random permutation per pool, so each expert has its own hot neurons. The location of
  the distribution is solved so that ``mean(p) == density`` exactly; the density of the
  generated trace is therefore exact in expectation (the realised one is reported).
- Each neuron follows a two-state Markov chain with stationary probability ``p_i`` and
  lag-1 autocorrelation ``persistence`` (see :mod:`sim.traces._synth_kernels`).
- Optional co-activation groups: blocks of ``group_size`` neurons of adjacent rank switch
  on together with a shared event, without changing any neuron's marginal.
- Context shifts (``drift``, optional): at tokens drawn with probability ``rate`` (or one
  per ``1 / rate`` tokens with ``spacing: regular``), a ``share`` of every pool's mobile
  neurons trade propensities (a topic change: other neurons
  become hot, in every layer at once). The hottest neurons that carry the first
  ``static`` of a pool's activations are static: hot in every context, as PowerInfer
  observes ("hot neurons are consistently activated across inputs"), which is what an
  offline profile can find. The chains then move to the new hot set at their
  refresh rate, which makes bursts of cache misses a few tokens long; these bursts, not
  the independent chains, are what puts a heavy tail on per-token miss rates. With a
  ``duration`` each shift is an excursion: that many tokens later the same neurons trade
  their propensities back, so the bursts come without leaving the profile's hot set stale.
- MoE routing: per layer, with probability ``routing.persistence`` a token keeps the
  previous token's experts, else a fresh set is drawn that includes expert ``e`` with
  probability ``top_k * popularity[e]``. Experts that are not routed keep their neuron
  state and are caught up exactly when routed again (time passes for them too).
- Predictor: predicted = (active neurons kept with probability ``recall``) + (false
  positives from a second chain over inactive neurons, with propensity proportional to
  ``p ** fp_skew`` scaled to give the requested precision and its own persistence).
  False positives are thus as temporally persistent as the predictor's real errors
  (a predictor errs on the same borderline neurons for similar hidden states).

Use :func:`synthesize` to stream chunks, :func:`synth_trace` for a lazily generated
:class:`~sim.traces.format.Trace`, :func:`write_synthetic` to save one. The same seed
gives identical arrays whichever way it is consumed and however it is chunked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.checks import check_int, check_optional_bool
from sim.errors import SimError
from sim.traces import _synth_kernels as K
from sim.traces.format import Trace, TraceChunk, TraceMeta, save_trace
from sim.traces.params import SynthDims, SynthParams, resolve_params

__all__ = ["SynthDims", "SyntheticTrace", "TraceSynthesizer", "solve_propensities", "synth_trace",
           "synthesize", "write_synthetic"]


_BUFFER_FACTOR = 1.15  # output buffers: expected ids x this (the kernel grows them if short)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _solve_monotone(f, dfdx, target: np.ndarray, lo: np.ndarray, hi: np.ndarray, x0: np.ndarray) -> np.ndarray:
    """Solve increasing ``f(x) = target`` per row: Newton steps kept inside a shrinking bracket."""
    x = np.clip(x0, lo, hi)
    for _ in range(200):
        fx = f(x)
        err = fx - target
        if np.all(np.abs(err) <= 1e-12 * np.maximum(np.abs(target), 1e-300)):
            break
        lo = np.where(err < 0, x, lo)
        hi = np.where(err > 0, x, hi)
        slope = dfdx(x)
        step = np.where(slope > 0, x - err / np.where(slope > 0, slope, 1.0), 0.5 * (lo + hi))
        x = np.where((step > lo) & (step < hi), step, 0.5 * (lo + hi))
    return x


def solve_propensities(shape: np.ndarray, density: float | np.ndarray) -> np.ndarray:
    """Propensities ``sigmoid(mu + shape)`` with ``mu`` solved so their mean is ``density``.

    ``shape`` is (..., neurons); ``density`` broadcasts to ``shape.shape[:-1]`` (one ``mu``
    per row, found by safeguarded Newton iterations).
    """
    shape = np.asarray(shape, dtype=np.float64)
    dens = np.broadcast_to(np.asarray(density, dtype=np.float64), shape.shape[:-1])[..., None]

    def mean_p(mu: np.ndarray) -> np.ndarray:
        return _sigmoid(mu + shape).mean(axis=-1, keepdims=True)

    def slope(mu: np.ndarray) -> np.ndarray:
        q = _sigmoid(mu + shape)
        return (q * (1 - q)).mean(axis=-1, keepdims=True)

    x0 = np.log(dens / (1 - np.minimum(dens, 1 - 1e-12))) - np.median(shape, axis=-1, keepdims=True)
    mu = _solve_monotone(mean_p, slope, dens, np.full(dens.shape, -80.0), np.full(dens.shape, 80.0), x0)
    p = _sigmoid(mu + shape)
    return np.minimum(1.0, p * (dens / p.mean(axis=-1, keepdims=True)))  # remove the last residue


def _false_positive_propensity(p: np.ndarray, recall: float | np.ndarray, precision: float | np.ndarray | None,
                               fp_rate: float | np.ndarray | None, skew: float | np.ndarray) -> np.ndarray:
    """Per-neuron propensity ``z`` of the false-positive chain, ``z = min(1, c * p**skew)``.

    ``c`` is solved so that the expected false positives per token, ``sum z (1 - p)``,
    give the requested precision (or false-positive rate over inactive neurons). ``p`` is
    (..., neurons); the other arguments broadcast to its leading dimensions.
    """
    p = np.asarray(p, dtype=np.float64)
    lead = p.shape[:-1]
    dens = p.sum(axis=-1)
    n = p.shape[-1]
    if precision is not None:
        target = np.broadcast_to(recall, lead) * dens * (1.0 / np.broadcast_to(precision, lead) - 1.0)
    else:
        target = np.broadcast_to(np.asarray(fp_rate, dtype=np.float64), lead) * (n - dens)
    target = np.asarray(target, dtype=np.float64)
    cap = (1.0 - p).sum(axis=-1)
    if np.any(target >= cap * 0.999):
        raise SimError(f"the predictor's false positives ({float(np.max(target)):.0f} per token) exceed the "
                       "inactive neurons; lower the false-positive rate or raise the precision", field="predictor")
    base = np.power(np.maximum(p, 1e-12), np.asarray(skew, dtype=np.float64)[..., None])
    inactive = 1.0 - p

    def expected(c: np.ndarray) -> np.ndarray:
        return (np.minimum(1.0, c[..., None] * base) * inactive).sum(axis=-1)

    def slope(c: np.ndarray) -> np.ndarray:
        return np.where(c[..., None] * base < 1.0, base * inactive, 0.0).sum(axis=-1)

    hi = np.ones(lead)
    while np.any(expected(hi) < target):
        hi = np.where(expected(hi) < target, 2.0 * hi, hi)
    hi = _solve_monotone(expected, slope, target, np.zeros(lead), hi, 0.5 * hi)
    z = np.minimum(1.0, hi[..., None] * base)
    return np.where((target > 0)[..., None], z, 0.0)


@dataclass
class _Tables:
    p_by_id: np.ndarray  # float32 (layers, experts, neurons)
    z_by_id: np.ndarray
    group_of_id: np.ndarray | None
    group_p: np.ndarray
    density: np.ndarray
    expected_predicted: np.ndarray


class TraceSynthesizer:
    """Stateful generator: call :meth:`next_chunk` repeatedly; holds the chains' state.

    Memory is dominated by per-neuron tables of ``layers * experts * neurons`` entries
    (about 70 MB for Mixtral-47B) plus one chunk of output. With drift the propensity
    tables are state too (context shifts rewrite them in place).
    """

    def __init__(self, params: SynthParams | str | Path, dims: SynthDims | Any, seed: int = 0, *,
                 predictions: bool | None = None):
        params, dims = resolve_params(params), SynthDims.coerce(dims)
        seed = check_int(seed, "seed")
        predictions = check_optional_bool(predictions, "predictions")
        self.params, self.dims, self.seed = params, dims, seed
        pred_spec = params.predictor(dims)
        self.with_pred = pred_spec is not None if predictions is None else predictions
        if self.with_pred and pred_spec is None:
            raise SimError(f"parameter set {params.name!r} has no predictor group; cannot produce predicted sets",
                           source=params.source, field="predictor")
        rng = np.random.default_rng(self.seed)
        self.key = np.uint64(rng.integers(1, 2**63 - 1, dtype=np.int64))
        n_l, n_e, n = dims.n_layers, dims.n_experts, dims.n_neurons
        padded = -(-n // 8) * 8
        density = params.density(dims)
        shape = params.propensity_shape(dims)
        self.refresh = 1.0 - params.persistence(dims)
        group_size, self.strength = params.coactivation()
        self.group_size = group_size if self.strength > 0 else 0
        self.drift_rate, self.drift_share, self.drift_regular, drift_static = params.drift(dims)
        self.drift_duration = params.drift_duration()
        if not np.any(self.drift_share > 0):
            self.drift_rate = 0.0

        # layers with the same density and shape (the common case) share one solve
        first: dict[bytes, int] = {}
        owner = np.array([first.setdefault(density[i].tobytes() + shape[i].tobytes(), i) for i in range(n_l)])
        unique = np.unique(owner)
        solved = -np.sort(-solve_propensities(shape[unique], density[unique]), axis=1)  # hottest first
        p_sorted = solved[np.searchsorted(unique, owner)]
        # static neurons: the hottest ones carrying the first drift.static of each pool's activations
        cum = np.cumsum(p_sorted, axis=1) / p_sorted.sum(axis=1, keepdims=True)
        n_static = (cum - p_sorted / p_sorted.sum(axis=1, keepdims=True) < drift_static[:, None]).sum(axis=1)
        self.drift_static_p = np.where(n_static > 0, p_sorted[np.arange(n_l), np.maximum(n_static - 1, 0)],
                                       np.inf).astype(np.float32)
        if self.group_size:
            n_groups = -(-n // self.group_size)
            last_rank = np.minimum((np.arange(n_groups) + 1) * self.group_size, n) - 1
            group_p = p_sorted[:, last_rank].copy()
        else:
            group_p = np.zeros((n_l, 1))
        if self.with_pred:
            assert pred_spec is not None
            self.recall = pred_spec["recall"].astype(np.float64)
            self.z_refresh = 1.0 - pred_spec["fp_persistence"]
            z_sorted = _false_positive_propensity(p_sorted, self.recall, pred_spec.get("precision"),
                                                  pred_spec.get("false_positive_rate"), pred_spec["fp_skew"])
            expected_pred = (self.recall * p_sorted.sum(1) + (z_sorted * (1 - p_sorted)).sum(1)) / n
            self.z_state = np.zeros((n_l, n_e, padded), np.uint8)
        else:
            self.recall = np.ones(n_l)
            self.z_refresh = np.ones(n_l)
            z_sorted = None
            expected_pred = np.zeros(n_l)
            self.z_state = np.zeros((1, 1, 1), np.uint8)
        self._density, self._expected_pred, self._group_p = density, expected_pred, group_p
        # The per-neuron tables need a random permutation of every pool (~0.1 s for Mixtral):
        # built on first use, so the metadata costs nothing and a trace read ahead on a
        # background thread builds them there. Nothing else draws from `rng` meanwhile.
        self._sorted: tuple[np.random.Generator, np.ndarray, np.ndarray | None] | None = (rng, p_sorted, z_sorted)
        self._tables: _Tables | None = None
        self.state = np.zeros((n_l, n_e, padded), np.uint8)  # chain states, padded to 8-byte words
        self.last_t = np.full((n_l, n_e), -1, np.int64)
        self.active_count = np.zeros(n_l, np.int64)
        self.rows_per_layer = 0
        if n_e > 1:
            self.popularity, self.route_persistence = params.routing(dims)
        else:
            self.popularity, self.route_persistence = np.ones((n_l, 1)), np.zeros(n_l)
        self.prev_route = np.zeros((n_l, dims.top_k), np.int16)
        self.has_prev = np.zeros(n_l, np.bool_)
        self.t = 0

    @property
    def tables(self) -> _Tables:
        """The per-neuron tables (propensity, false-positive propensity, group by neuron id)."""
        if self._tables is None:
            assert self._sorted is not None
            rng, p_sorted, z_sorted = self._sorted
            n_l, n_e, n = self.dims.n_layers, self.dims.n_experts, self.dims.n_neurons
            # neuron id -> rank: a fresh random permutation for every (layer, expert) pool
            rank = rng.permuted(np.broadcast_to(np.arange(n, dtype=np.int32), (n_l * n_e, n)), axis=1)
            rank = np.ascontiguousarray(rank.reshape(n_l, n_e, n))
            p32 = p_sorted.astype(np.float32)
            p_by_id = np.ascontiguousarray(np.stack([p32[layer][rank[layer]] for layer in range(n_l)]))
            # None without groups: the kernels then leave the grouped branches out when they compile
            group_of_id = np.ascontiguousarray(rank // self.group_size) if self.group_size else None
            if z_sorted is not None:
                z32 = z_sorted.astype(np.float32)
                z_by_id = np.ascontiguousarray(np.stack([z32[layer][rank[layer]] for layer in range(n_l)]))
            else:
                z_by_id = np.zeros((1, 1, 1), np.float32)
            self._tables = _Tables(p_by_id, z_by_id, group_of_id, self._group_p, self._density,
                                   self._expected_pred)
            self._sorted = None
        return self._tables

    @property
    def target_density(self) -> np.ndarray:
        return self._density

    @property
    def expected_predicted_density(self) -> np.ndarray:
        return self._expected_pred

    def drift_tokens(self, n_tokens: int) -> np.ndarray:
        """The tokens in ``[0, n_tokens)`` at which a context shift happens (empty when drift is off)."""
        return K.drift_events(self.key, 0, int(n_tokens), float(self.drift_rate), self.drift_regular)

    def realised_density(self) -> np.ndarray:
        """Per-layer fraction of an expert's neurons active, over the tokens generated so far."""
        if self.rows_per_layer == 0:
            return np.zeros(self.dims.n_layers)
        return self.active_count / (self.rows_per_layer * self.dims.n_neurons)

    def next_chunk(self, n_tokens: int) -> TraceChunk:
        """Generate the next ``n_tokens`` tokens."""
        d, tb = self.dims, self.tables
        experts = np.zeros((n_tokens, d.n_layers, d.top_k), np.int16)
        if d.n_experts > 1:
            K.route_chunk(self.t, n_tokens, self.key, self.popularity, self.route_persistence, self.prev_route,
                          self.has_prev, experts)
        rows = n_tokens * d.n_layers * d.top_k
        slack = 2 * self.state.shape[2] + 1024
        cap_a = int(rows * d.n_neurons * tb.density.mean() * _BUFFER_FACTOR) + slack
        cap_p = int(rows * d.n_neurons * tb.expected_predicted.mean() * _BUFFER_FACTOR) + slack if self.with_pred else 1
        offsets, ids, n, pred_off, pred_ids, m = K.neuron_chunk(
            self.t, self.key, experts, tb.p_by_id, self.refresh, self.state, self.last_t,
            self.with_pred, tb.z_by_id, self.z_refresh, self.z_state, self.recall,
            self.group_size, tb.group_of_id, tb.group_p, self.strength,
            self.drift_rate, self.drift_regular, self.drift_duration, self.drift_share, self.drift_static_p,
            self.active_count,
            np.empty(cap_a, np.int32), np.empty(cap_p, np.int32))
        # views of the first n / m entries: the untouched tail of the buffer costs no memory
        ids, pred_ids = ids[:n], pred_ids[:m]
        chunk = TraceChunk(self.t, offsets, ids, experts, pred_off if self.with_pred else None,
                           pred_ids if self.with_pred else None)
        self.t += n_tokens
        self.rows_per_layer += n_tokens * d.top_k
        return chunk

    def meta(self, n_tokens: int, chunk_tokens: int, prompt_tokens: int = 0) -> TraceMeta:
        d = self.dims
        extra: dict[str, Any] = {"params": self.params.name, "params_source": self.params.source,
                                 "target_density": [round(float(x), 6) for x in self._density]}
        if self.params.raw.get("derived_from"):  # a derived preset says where each group came from
            extra["derived_from"] = dict(self.params.raw["derived_from"])
        predictor: dict[str, Any] = {}
        if self.with_pred:
            spec = self.params.predictor(d) or {}
            predictor = {"model": "synthetic", "recall": [round(float(x), 6) for x in spec["recall"]]}
            if "precision" in spec:
                predictor["precision"] = [round(float(x), 6) for x in spec["precision"]]
            else:
                predictor["false_positive_rate"] = [round(float(x), 6) for x in spec["false_positive_rate"]]
        return TraceMeta(model=d.model, n_layers=d.n_layers, n_neurons=d.n_neurons, hidden=d.hidden,
                         n_experts=d.n_experts, top_k=d.top_k, n_tokens=n_tokens, prompt_tokens=prompt_tokens,
                         source="synthetic", seed=self.seed, chunk_tokens=chunk_tokens,
                         has_predictions=self.with_pred, predictor=predictor, extra=extra)


def _check_counts(n_tokens: int, chunk_tokens: int, prompt_tokens: int = 0) -> tuple[int, int, int]:
    """The token counts as Python ints (what a trace file's metadata holds), or a SimError."""
    n_tokens = check_int(n_tokens, "n_tokens", 0)
    chunk_tokens = check_int(chunk_tokens, "chunk_tokens", 1)
    prompt_tokens = check_int(prompt_tokens, "prompt_tokens", 0, n_tokens)
    return n_tokens, chunk_tokens, prompt_tokens


def synthesize(params: SynthParams | str | Path, dims: SynthDims | Any, n_tokens: int, seed: int = 0, *,
               chunk_tokens: int = 64, predictions: bool | None = None,
               synthesizer: TraceSynthesizer | None = None) -> Iterator[TraceChunk]:
    """Yield the trace chunk by chunk (``chunk_tokens`` tokens each, the last may be short).

    ``params`` is a :class:`SynthParams`, a preset name or a parameter file; ``dims`` a
    :class:`SynthDims`, a model profile or a model name. Pass ``synthesizer`` to read the
    realised density afterwards.
    """
    n_tokens, chunk_tokens, _ = _check_counts(n_tokens, chunk_tokens)
    if synthesizer is not None and not isinstance(synthesizer, TraceSynthesizer):
        raise SimError(f"must be None or a TraceSynthesizer, got {type(synthesizer).__name__}", field="synthesizer")
    gen = synthesizer or TraceSynthesizer(params, dims, seed, predictions=predictions)
    return _stream(gen, n_tokens, chunk_tokens)  # arguments are checked now, not at the first chunk


def _stream(gen: TraceSynthesizer, n_tokens: int, chunk_tokens: int) -> Iterator[TraceChunk]:
    done = 0
    while done < n_tokens:
        step = min(chunk_tokens, n_tokens - done)
        yield gen.next_chunk(step)
        done += step


class SyntheticTrace(Trace):
    """A :class:`Trace` whose chunks are generated on demand (no file), identically each time."""

    def __init__(self, params: SynthParams | str | Path, dims: SynthDims | Any, n_tokens: int, seed: int,
                 chunk_tokens: int, predictions: bool | None, prompt_tokens: int = 0):
        n_tokens, chunk_tokens, prompt_tokens = _check_counts(n_tokens, chunk_tokens, prompt_tokens)
        probe = TraceSynthesizer(params, dims, seed, predictions=predictions)
        params, dims, seed, predictions = probe.params, probe.dims, probe.seed, probe.with_pred
        self._spec = (params, dims, n_tokens, seed, chunk_tokens, predictions)
        super().__init__(probe.meta(n_tokens, chunk_tokens, prompt_tokens), None)
        self._probe: TraceSynthesizer | None = probe

    def synthesizer(self) -> TraceSynthesizer:
        params, dims, _, seed, _, predictions = self._spec
        if self._probe is not None:  # reuse the tables built for the metadata, once
            gen, self._probe = self._probe, None
            return gen
        return TraceSynthesizer(params, dims, seed, predictions=predictions)

    def chunks(self) -> Iterator[TraceChunk]:
        if self._chunks is not None:
            yield from self._chunks
            return
        params, dims, n_tokens, seed, chunk_tokens, _predictions = self._spec
        yield from synthesize(params, dims, n_tokens, seed, chunk_tokens=chunk_tokens,
                              synthesizer=self.synthesizer())


def synth_trace(params: SynthParams | str | Path, dims: SynthDims | Any, n_tokens: int, seed: int = 0, *,
                chunk_tokens: int = 64, predictions: bool | None = None, prompt_tokens: int = 0) -> Trace:
    """A lazily generated trace; iterating its chunks twice gives identical arrays.

    ``params``: a :class:`SynthParams`, a preset name or a parameter file. ``dims``: a
    :class:`SynthDims`, a model profile or a model name (its dimensions). ``predictions``:
    None (as the parameter set says), True or False. ``prompt_tokens``: the first
    ``prompt_tokens`` (in ``[0, n_tokens]``) are prefill. Bad arguments are SimErrors.
    """
    return SyntheticTrace(params, dims, n_tokens, seed, chunk_tokens, predictions, prompt_tokens)


def write_synthetic(path: str | Path, params: SynthParams | str | Path, dims: SynthDims | Any, n_tokens: int,
                    seed: int = 0, *, chunk_tokens: int = 64, predictions: bool | None = None,
                    prompt_tokens: int = 0) -> tuple[Path, TraceSynthesizer]:
    """Generate and save a trace; returns the path and the synthesizer (for its realised density)."""
    n_tokens, chunk_tokens, prompt_tokens = _check_counts(n_tokens, chunk_tokens, prompt_tokens)
    gen = TraceSynthesizer(params, dims, seed, predictions=predictions)
    meta = gen.meta(n_tokens, chunk_tokens, prompt_tokens)
    out = save_trace(path, meta, synthesize(gen.params, gen.dims, n_tokens, gen.seed, chunk_tokens=chunk_tokens,
                                            synthesizer=gen))
    return out, gen
