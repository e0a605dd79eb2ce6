"""synth_trace / write_synthetic / SynthDims arguments: every bad argument is a one-line SimError
naming it; numpy scalars are the numbers they are (identical traces, saveable metadata);
booleans are not numbers; dims may be a model profile or a model name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from arg_helpers import raises_on
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.errors import SimError
from sim.traces.format import Trace
from sim.traces.params import SynthDims, params_from_mapping
from sim.traces.synth import TraceSynthesizer, synth_trace, synthesize, write_synthetic

RAW = {"name": "t", "density": {"value": [0.05, 0.2]}, "propensity": {"dist": "logitnormal", "sigma": 1.5},
       "persistence": {"value": [0.3, 0.7]}, "predictor": {"recall": 0.9, "precision": 0.6},
       "routing": {"popularity": [0.4, 0.3, 0.2, 0.1], "persistence": [0.2, 0.6]}}
PARAMS = params_from_mapping(RAW)
DIMS = SynthDims(2, 40, 8, 4, 2)
NAN = float("nan")


_raises = raises_on


def _arrays(trace):
    return [(c.start, c.offsets.tolist(), c.ids.tolist(), c.experts.tolist(),
             None if c.pred_ids is None else c.pred_ids.tolist()) for c in trace.chunks()]


# -- dims ------------------------------------------------------------------------------------------

def test_dims_may_be_a_model_profile_or_a_model_name():
    profile = sim.load_model("opt-6.7b")
    want = SynthDims.from_model(profile)
    for dims in (profile, "opt-6.7b", want):
        trace = synth_trace("opt-6.7b", dims, 2, seed=1, chunk_tokens=1)
        assert trace.meta.model == "opt-6.7b" and trace.meta.n_neurons == want.n_neurons
        assert trace.meta.n_layers == want.n_layers and trace.meta.hidden == want.hidden
    a = synth_trace("opt-6.7b", profile, 2, seed=1)
    b = synth_trace("opt-6.7b", want, 2, seed=1)
    assert a.meta == b.meta and _arrays(a) == _arrays(b)


@pytest.mark.parametrize("dims", [None, {"n_layers": 2, "n_neurons": 40, "hidden": 8}, 7, [2, 40, 8], b"opt-6.7b",
                                  "no-such-model", Path("/nonexistent/model.yaml")])
def test_bad_dims(dims):
    _raises("dims", synth_trace, PARAMS, dims, 4)
    _raises("dims", synthesize, PARAMS, dims, 4)
    _raises("dims", TraceSynthesizer, PARAMS, dims)


def test_numpy_dims_are_python_ints_and_save(tmp_path):
    dims = SynthDims(np.int64(2), np.int32(40), np.uint16(8), np.int8(4), np.int64(2))
    assert dims == DIMS and all(type(getattr(dims, f)) is int
                                for f in ("n_layers", "n_neurons", "hidden", "n_experts", "top_k"))
    trace = synth_trace(PARAMS, dims, 6, seed=3, chunk_tokens=4)
    path = trace.save(tmp_path / "np.npz")
    again = Trace.load(path)
    assert again.meta == synth_trace(PARAMS, DIMS, 6, seed=3, chunk_tokens=4).meta
    assert _arrays(again) == _arrays(synth_trace(PARAMS, DIMS, 6, seed=3, chunk_tokens=4))


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"n_layers": 2.0}, "n_layers"), ({"n_layers": True}, "n_layers"), ({"n_neurons": 0}, "n_neurons"),
    ({"n_neurons": 2**31}, "n_neurons"), ({"hidden": "8"}, "hidden"), ({"n_experts": 2**15}, "n_experts"),
    ({"top_k": np.float64(1)}, "top_k"), ({"top_k": 5}, "top_k"), ({"model": 3}, "model"),
    ({"n_layers": 2**70}, "n_layers"),
])
def test_bad_synth_dims(kwargs, field):
    base = {"n_layers": 2, "n_neurons": 40, "hidden": 8, "n_experts": 4, "top_k": 2}
    _raises(field, SynthDims, **{**base, **kwargs})


# -- the other arguments ------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "field"), [
    ({"n_tokens": True}, "n_tokens"), ({"n_tokens": -1}, "n_tokens"), ({"n_tokens": 4.0}, "n_tokens"),
    ({"n_tokens": None}, "n_tokens"), ({"n_tokens": "4"}, "n_tokens"),
    ({"chunk_tokens": True}, "chunk_tokens"), ({"chunk_tokens": 0}, "chunk_tokens"),
    ({"chunk_tokens": 2.5}, "chunk_tokens"), ({"chunk_tokens": None}, "chunk_tokens"),
    ({"prompt_tokens": -1}, "prompt_tokens"), ({"prompt_tokens": 1.5}, "prompt_tokens"),
    ({"prompt_tokens": None}, "prompt_tokens"), ({"prompt_tokens": True}, "prompt_tokens"),
    ({"prompt_tokens": 5}, "prompt_tokens"),  # more than n_tokens=4
    ({"predictions": "no"}, "predictions"), ({"predictions": 0}, "predictions"),
    ({"predictions": NAN}, "predictions"),
    ({"seed": True}, "seed"), ({"seed": -1}, "seed"), ({"seed": 1.0}, "seed"), ({"seed": None}, "seed"),
    ({"params": 5}, "params"), ({"params": None}, "params"), ({"params": PARAMS.raw}, "params"),
])
def test_bad_synth_trace_arguments(kwargs, field):
    args = {"params": PARAMS, "dims": DIMS, "n_tokens": 4, **kwargs}
    msg = _raises(field, synth_trace, **args)
    if field == "prompt_tokens":
        assert "[0, 4]" in msg


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"n_tokens": True}, "n_tokens"), ({"chunk_tokens": True}, "chunk_tokens"),
    ({"prompt_tokens": -1}, "prompt_tokens"), ({"prompt_tokens": 9}, "prompt_tokens"),
    ({"predictions": "no"}, "predictions"), ({"dims": None}, "dims"),
])
def test_bad_write_synthetic_arguments(tmp_path, kwargs, field):
    args = {"params": PARAMS, "dims": DIMS, "n_tokens": 4, **kwargs}
    _raises(field, write_synthetic, tmp_path / "x.npz", **args)
    assert not (tmp_path / "x.npz").exists()


def test_predictions_take_numpy_bools():
    a = synth_trace(PARAMS, DIMS, 5, seed=2, predictions=np.bool_(False))
    b = synth_trace(PARAMS, DIMS, 5, seed=2, predictions=False)
    assert not a.meta.has_predictions and _arrays(a) == _arrays(b)


def test_numpy_scalars_give_identical_traces(tmp_path):
    kw = {"seed": 4, "chunk_tokens": 3, "prompt_tokens": 2}
    ref = synth_trace(PARAMS, DIMS, 7, **kw)
    for n_tokens, seed, chunk, prompt in ((np.int64(7), np.int32(4), np.uint8(3), np.int16(2)),
                                          (np.uint64(7), np.int8(4), np.int64(3), np.uint32(2))):
        trace = synth_trace(PARAMS, DIMS, n_tokens, seed, chunk_tokens=chunk, prompt_tokens=prompt)
        assert trace.meta == ref.meta and _arrays(trace) == _arrays(ref)
        assert all(type(getattr(trace.meta, f)) is int for f in ("n_tokens", "chunk_tokens", "prompt_tokens", "seed"))
        assert Trace.load(trace.save(tmp_path / "t.npz")).meta == ref.meta  # the metadata saves
    path, _ = write_synthetic(tmp_path / "w.npz", PARAMS, DIMS, np.int64(7), np.int64(4), chunk_tokens=np.int64(3),
                              prompt_tokens=np.int64(2))
    assert Trace.load(path).meta == ref.meta and _arrays(Trace.load(path)) == _arrays(ref)


def test_prompt_tokens_up_to_n_tokens_are_fine():
    assert synth_trace(PARAMS, DIMS, 4, prompt_tokens=4).meta.prompt_tokens == 4
    assert synth_trace(PARAMS, DIMS, 0, prompt_tokens=0).meta.n_tokens == 0


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 9), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=3), st.sampled_from([np.int64(3), np.float32(2.0), np.bool_(True), [1], {}]))


@settings(max_examples=150, deadline=None)
@given(n_tokens=JUNK, seed=JUNK, chunk=JUNK, prompt=JUNK, pred=JUNK)
def test_junk_is_a_trace_or_a_sim_error(n_tokens, seed, chunk, prompt, pred):
    try:
        trace = synth_trace(PARAMS, DIMS, n_tokens, seed, chunk_tokens=chunk, predictions=pred, prompt_tokens=prompt)
    except SimError as err:
        assert "\n" not in str(err) and err.field in ("n_tokens", "seed", "chunk_tokens", "predictions",
                                                      "prompt_tokens")
        return
    trace.meta.check()
    assert sum(c.n_tokens for c in trace.chunks()) == trace.meta.n_tokens


@pytest.mark.parametrize(("change", "field"), [
    ({"density": {"value": NAN}}, "density"),
    ({"persistence": {"value": NAN}}, "persistence"),
    ({"propensity": {"dist": "logitnormal", "sigma": NAN}}, "propensity"),
    ({"predictor": {"recall": NAN, "precision": 0.6}}, "recall"),
    ({"routing": {"popularity": [0, 0, 0, 0], "persistence": 0.2}}, "routing.popularity"),
])
def test_a_nan_or_an_all_zero_parameter_is_refused_not_generated(change, field):
    """A scalar NaN fails no range comparison: it once generated a trace (persistence 1, a
    value the bounds forbid) or crashed sizing the output; all-zero expert shares divided by 0."""
    with pytest.raises(SimError, match=field):
        TraceSynthesizer(params_from_mapping({**RAW, **change}), DIMS, 0).next_chunk(2)
