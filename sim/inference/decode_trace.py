"""Record a decoder's *decode* trace at a stated density, and measure what that density costs.

The MiniLM trace (:mod:`sim.inference.recorder`) is teacher-forced through an encoder: it
has no decode phase. Here a decoder (:mod:`sim.inference.llama`) runs as a phone would:
it prefills a prompt, then generates greedily, token by token, with every FFN computing
only the neurons that pass the CATS thresholds (:mod:`sim.inference.sparsify`) set for a
target density on *other* text. Each token's computed set is what the trace records, so
the trace's locality is the one of autoregressive decoding at that density (the generated
tokens feed back).

Predicted sets come from a rank-``r`` low-rank predictor per layer
(:func:`~sim.inference.predictor.fit_lowrank`, on the 0/1 labels: SiLU has no
pre-activation that orders activity) trained on FFN inputs of the other text and
evaluated on the trace's tokens, which it never saw.

:func:`quality_table` measures the cost of each density: perplexity on held-out
public-domain text (teacher-forced) and the greedy continuation's agreement with dense
decoding (position by position, and the length of the identical prefix).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from sim.errors import SimError
from sim.traces.format import TraceMeta, save_trace

from .llama import DensityMeter, LlamaDecoder
from .predictor import default_rank, evaluate, fit_lowrank
from .recorder import _chunks, _recompress
from .sparsify import ThresholdSparsity, calibrate, check_density
from .transformer import KVCache

DENSITIES = (1.0, 0.5, 0.3, 0.15)
QUALITY_PROMPTS = ("The capital of France is", "It is a truth universally acknowledged, that",
                   "It was the best of times, it was the worst of times,")


def _ids(dec: LlamaDecoder, text_path: str | Path, n: int | None, field: str) -> tuple[np.ndarray, str]:
    path = Path(text_path)
    if not path.is_file():
        raise SimError("no such text file", source=str(path), field=field)
    text = path.read_text(encoding="utf-8")
    ids = dec.tok.encode(text)
    if n is not None and ids.size < n:
        raise SimError(f"text too short: it yields {ids.size} tokens, {n} needed", source=str(path), field=field)
    return (ids if n is None else ids[:n]), hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Recorder:
    """An ``active`` function that applies ``inner`` and keeps each call's FFN input and mask.

    With ``record`` the mask kept is ``record``'s instead (the FFN still computes ``inner``'s):
    the sets a sparser threshold would select along a decode that stays as coherent as
    ``inner``'s density allows.
    """

    def __init__(self, inner: ThresholdSparsity | None, n_layers: int, n_neurons: int,
                 record: ThresholdSparsity | None = None):
        self.inner, self.record = inner, record
        self.x: list[list[np.ndarray]] = [[] for _ in range(n_layers)]
        self.m: list[list[np.ndarray]] = [[] for _ in range(n_layers)]
        self.n = n_neurons

    def __call__(self, layer: int, x: np.ndarray, experts: np.ndarray) -> np.ndarray:
        mask = (self.inner(layer, x, experts) if self.inner is not None
                else np.ones((x.shape[0], 1, self.n), dtype=bool))
        kept = mask if self.record is None else self.record(layer, x, experts)
        self.x[layer].append(x.copy())
        self.m[layer].append(kept[:, 0, :].copy())
        return mask

    def arrays(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return [np.concatenate(v) for v in self.x], [np.concatenate(v) for v in self.m]


def quality_table(dec: LlamaDecoder, eval_ids: np.ndarray, calib_ids: np.ndarray,
                  densities: Sequence[float] = DENSITIES, prompts: Sequence[str] = QUALITY_PROMPTS,
                  steps: int = 16) -> list[dict[str, Any]]:
    """Per target density: realised density, perplexity on ``eval_ids``, greedy agreement with dense."""
    dense_runs = [dec.generate(p, steps, stop_at_eos=False).ids for p in prompts]
    rows = []
    for d in densities:
        d = check_density(d, "densities")
        sp = calibrate(dec.net, calib_ids, d) if d < 1.0 else None
        meter = DensityMeter()
        metered = dec._metered(sp, meter)
        ppl = dec.perplexity(eval_ids, active=metered)
        same, prefix = [], []
        for p, ref in zip(prompts, dense_runs, strict=True):
            got = dec.generate(p, steps, active=sp, stop_at_eos=False).ids if sp is not None else ref
            eq = got == ref
            same.append(float(eq.mean()))
            prefix.append(int(np.argmin(eq)) if not eq.all() else steps)
        rows.append({"target_density": d, "density": round(meter.density, 4), "perplexity": round(ppl, 3),
                     "greedy_agreement": round(float(np.mean(same)), 4),
                     "identical_prefix_mean": round(float(np.mean(prefix)), 2)})
    return rows


def quality_markdown(rows: Sequence[dict[str, Any]], eval_tokens: int, steps: int, n_prompts: int) -> str:
    """The quality table as Markdown (the trace's .md embeds it verbatim)."""
    lines = [f"| target density | realised density | perplexity ({eval_tokens} tokens) | greedy agreement "
             f"({n_prompts} prompts x {steps} tokens) | identical prefix (tokens) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['target_density']:.0%} | {r['density']:.3f} | {r['perplexity']:.2f} | "
                     f"{r['greedy_agreement']:.3f} | {r['identical_prefix_mean']:.1f} |")
    return "\n".join(lines)


def record_decode_trace(dec: LlamaDecoder, out: str | Path, *, prompt_text: str | Path, other_text: str | Path,
                        prompt_tokens: int = 24, decode_tokens: int = 72, density: float = 0.3,
                        calib_tokens: int = 256, train_tokens: int = 256, rank: int | None = None,
                        target_recall: float = 0.95, chunk_tokens: int = 32, seed: int = 0,
                        quality: list[dict[str, Any]] | None = None, compresslevel: int | None = None,
                        record_density: float | None = None) -> Path:
    """Prefill ``prompt_tokens`` of ``prompt_text``, decode ``decode_tokens`` greedily at ``density``; save a trace.

    ``other_text`` supplies the calibration tokens of the thresholds and the predictor's
    training tokens (its first ``calib_tokens`` and the ``train_tokens`` after them).
    ``record_density`` (default ``density``) records instead the sets that thresholds for
    that density select while the FFNs compute at ``density``: a 135M model decoding at
    15% produces no text (see the quality table), so the locality of 15% sets is measured
    along a decode that still does.
    """
    density = check_density(density, "density")
    record_density = density if record_density is None else check_density(record_density, "record_density")
    for name, v in (("prompt_tokens", prompt_tokens), ("decode_tokens", decode_tokens),
                    ("calib_tokens", calib_tokens), ("train_tokens", train_tokens), ("chunk_tokens", chunk_tokens)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise SimError(f"must be a positive integer, got {v!r}", field=name)
    if train_tokens < 16:
        raise SimError(f"must be >= 16 to train a predictor, got {train_tokens}", field="train_tokens")
    cfg = dec.cfg
    prompt, prompt_sha = _ids(dec, prompt_text, prompt_tokens, "prompt_text")
    other, other_sha = _ids(dec, other_text, calib_tokens + train_tokens, "other_text")
    sp = calibrate(dec.net, other[:calib_tokens], density) if density < 1.0 else None
    sp_rec = None
    if record_density != density:
        sp_rec = calibrate(dec.net, other[:calib_tokens], record_density) if record_density < 1.0 else \
            ThresholdSparsity(dec.net, np.full(cfg.n_layers, -1.0), target_density=1.0)
    kept = sp_rec if sp_rec is not None else sp

    rec = _Recorder(sp, cfg.n_layers, cfg.n_neurons, sp_rec)
    gen = dec.generate(prompt, decode_tokens, active=rec, stop_at_eos=False)
    # the last generated token was chosen but not run: the trace holds the tokens that ran
    x_trace, active = rec.arrays()
    n_tok = active[0].shape[0]

    train = _Recorder(sp, cfg.n_layers, cfg.n_neurons, sp_rec)
    with threadpool_limits(limits=1, user_api="blas"):
        dec.net.forward(other[calib_tokens:calib_tokens + train_tokens], KVCache(), active=train)
    x_train, m_train = train.arrays()
    r = rank or default_rank(cfg.hidden, cfg.n_neurons)
    preds, size, flops = [], 0, 0
    for layer in range(cfg.n_layers):
        p = fit_lowrank(x_train[layer], m_train[layer], r, target_recall=target_recall)
        preds.append(p.predict(x_trace[layer]))
        size += p.size_bytes()
        flops += p.flops_per_token()
    q = [evaluate(p, a) for p, a in zip(preds, active, strict=True)]
    total = sum(q[1:], q[0])
    info: dict[str, Any] = {
        "kind": "lowrank", "rank": r, "target": "labels", "target_recall": target_recall,
        "training": f"{Path(other_text).name}: the {train_tokens} tokens after its first {calib_tokens} "
                    "(the thresholds' calibration tokens), run teacher-forced at the same thresholds",
        "train_tokens": train_tokens, "size_bytes": int(size), "bytes_per_value": 4, "flops_per_token": int(flops),
        "recall": [round(x.recall, 6) for x in q], "precision": [round(x.precision, 6) for x in q],
        "fnr": [round(x.fnr, 6) for x in q], "evaluated_on": "the trace's tokens (unseen in training)",
        "recall_mean": round(total.recall, 6), "precision_mean": round(total.precision, 6),
        "fnr_mean": round(total.fnr, 6)}
    extra: dict[str, Any] = {
        "weights": "real checkpoint", "checkpoint": dec.net.weights.origin, "architecture": cfg.arch,
        "activation": cfg.activation, "formats": dec.formats,
        "mode": (f"decoder: prefill of {prompt_tokens} prompt tokens, then greedy autoregressive decode of "
                 f"{n_tok - prompt_tokens} tokens with a KV cache; every FFN computes only its recorded set"),
        "activity": "|SiLU(gate.x)| > per-layer threshold (CATS, arXiv 2404.08763); " + (
            "the recorded set is the one computed" if sp_rec is None else
            f"the recorded set is the one thresholds for {record_density:g} density select, while the FFNs "
            f"compute at {density:g}"),
        "target_density": density,
        "thresholds": [round(float(t), 6) for t in (sp.thresholds if sp is not None else [])],
        "thresholds_calibrated_on": f"the first {calib_tokens} tokens of {Path(other_text).name} (dense pass)",
        "text": Path(prompt_text).name, "text_sha256": prompt_sha,
        "other_text": Path(other_text).name, "other_text_sha256": other_sha,
        "generated_text": dec.tok.decode(gen.ids[:-1]), "tokenizer": "ByteBPE (GGUF metadata)",
        "density_per_layer": [round(float(a.mean()), 6) for a in active],
        "decode_density": round(gen.density, 6),
    }
    if sp_rec is not None:
        extra["record_density"] = record_density
        extra["record_thresholds"] = [round(float(t), 6) for t in (kept.thresholds if record_density < 1.0 else [])]
    if quality is not None:
        extra["quality"] = quality
    meta = TraceMeta(model=cfg.name, n_layers=cfg.n_layers, n_neurons=cfg.n_neurons, hidden=cfg.hidden,
                     n_experts=1, top_k=1, n_tokens=n_tok, prompt_tokens=prompt_tokens, source="recorded",
                     seed=seed, chunk_tokens=chunk_tokens, has_predictions=True,
                     activation_threshold=None, predictor=info, extra=extra)
    act3 = [a[:, None, :] for a in active]
    pred3 = [p[:, None, :] for p in preds]
    experts = np.zeros((n_tok, cfg.n_layers, 1), np.int64)
    try:
        path = save_trace(out, meta, _chunks(act3, pred3, experts, chunk_tokens))
        if compresslevel is not None:
            _recompress(path, compresslevel)
    except OSError as exc:
        raise SimError(f"cannot write the trace ({exc})", source=str(out)) from None
    return path


def make_shipped(out: str | Path, corpus: str | Path, *, eval_tokens: int = 128, steps: int = 16,
                 density: float = 0.3, compresslevel: int = 9) -> Path:
    """The trace shipped under traces/: quality table first, then the decode trace (both in its metadata)."""
    from .llama import load_llama

    corpus = Path(corpus)
    prompt_text = corpus / "pride_and_prejudice_ch1.txt"
    other_text = corpus / "tale_of_two_cities_ch1.txt"
    dec = load_llama()
    calib, _ = _ids(dec, other_text, 256, "other_text")
    eval_ids, _ = _ids(dec, prompt_text, None, "prompt_text")
    eval_ids = eval_ids[-eval_tokens - 1:]  # the chapter's end: not the part the trace decodes from
    rows = quality_table(dec, eval_ids, calib, steps=steps)
    for r in rows:
        r |= {"eval_text": prompt_text.name, "eval_tokens": int(eval_ids.size - 1), "steps": steps,
              "prompts": list(QUALITY_PROMPTS), "calibrated_on": f"the first 256 tokens of {other_text.name}"}
    return record_decode_trace(dec, out, prompt_text=prompt_text, other_text=other_text, density=density,
                               quality=rows, compresslevel=compresslevel)


if __name__ == "__main__":
    import sys

    print(make_shipped(sys.argv[1], sys.argv[2]))
