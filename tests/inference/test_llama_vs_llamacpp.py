"""The numpy decoder against llama.cpp itself (llama-cpp-python, the `reference` extra) on the same GGUF file.

llama.cpp computes Q4_1 products on int8-quantised activations (Q8_1), the numpy core on
fp32 dequantised weights, so logits differ by that rounding: measured on these prompts, a
near-constant shift (up to 0.6 logit, which no softmax sees) plus a spread whose largest
entry over the 49,152-token vocabulary is 0.22-0.34 of the logits' standard deviation
(correlation 0.998-0.9997). The tolerance is stated on that scale. Greedy tokens must
agree for 32 steps from each prompt. Of five prompts tried, two ("Water boils at a
temperature of", "Photosynthesis is the process by which") part ways with llama.cpp at
steps 9 and 8, where llama.cpp's own top two logits are within 0.03 of each other: a
near tie that the activation rounding decides.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.inference.fetch import smollm2_cached, smollm2_path

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the `reference` extra) is not installed")
pytestmark = pytest.mark.skipif(not smollm2_cached(),
                                reason="SmolLM2-135M is not fetched: run `python -m sim.inference.fetch smollm2`")

PROMPTS = ("Once upon a time, in a small village,", "The three primary colors are",
           "The first president of the United States was")
STEPS = 32
# last-token logits: max |numpy - llama.cpp| over the vocabulary after removing the mean shift, as a share
# of the llama.cpp logits' standard deviation, and their correlation
LOGIT_TOLERANCE = 0.4
MIN_CORRELATION = 0.995


@pytest.fixture(scope="module")
def reference():
    return llama_cpp.Llama(model_path=str(smollm2_path()), n_ctx=128, n_threads=1, n_batch=64, verbose=False,
                           logits_all=True, seed=0)


def _greedy(llm, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    llm.reset()
    llm.eval(ids)
    first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    out: list[int] = []
    for _ in range(steps):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(nxt)
        llm.eval([nxt])
    return out, first


@pytest.mark.parametrize("prompt", PROMPTS)
def test_tokens_and_logits_agree_with_llama_cpp(reference, smollm2, prompt):
    ids = smollm2.tok.encode(prompt).tolist()
    assert ids == reference.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    ref_tokens, ref_logits = _greedy(reference, ids, STEPS)
    gen = smollm2.generate(prompt, STEPS, stop_at_eos=False)
    assert gen.ids.tolist() == ref_tokens
    ours = smollm2.logits(smollm2.net.forward(np.array(ids))[-1]).astype(np.float64)
    diff = ours - ref_logits
    err = np.abs(diff - diff.mean()).max() / ref_logits.std()
    assert err < LOGIT_TOLERANCE, f"max logit difference {err:.3g} of the logits' std"
    assert np.corrcoef(ours, ref_logits)[0, 1] > MIN_CORRELATION
    assert int(np.argmax(ours)) == int(np.argmax(ref_logits))
