"""Attribution patching's backward one layer at a time: the same gradients as one backward through the
whole forward (the chain rule, checked on every architecture), and a fall-back to the whole backward
where stepping does not reproduce the model. The memory it saves is measured by benchmarks/audit.py."""

import importlib

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.causal import attribution_patch, trace_pairs
from rewardlens.causal._engine import site_point, sites
from rewardlens.model import TraceKey
from rewardlens.model.internal import collate
from rewardlens.zoo import DEMO_PAIRS
from tests.helpers.tiny import ARCHS

ATP = importlib.import_module("rewardlens.causal._attribution_patching")
LAYERWISE = importlib.import_module("rewardlens.causal._layerwise")


def _setup(model):
    seqs, _ = model.encode(DEMO_PAIRS[:3])
    batch = collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
    points = {s.key: site_point(model, s, batch.read_index) for s in sites(model, "head")}
    final = model.final_points(batch, gate=False)[TraceKey.final()]
    coef = trace_pairs(model, DEMO_PAIRS[:3]).clean.coef  # the readout (a gated head's from its clean gate)
    return batch, points, final, coef


@pytest.mark.parametrize("arch", ARCHS)
def test_one_layer_at_a_time_gives_the_whole_backwards_gradients(tiny_root, arch):
    model = rl.load(str(tiny_root[arch]))
    batch, points, final, coef = _setup(model)
    got = LAYERWISE.layerwise_grads(model, batch, coef, lambda: ATP._probes(points, final))
    assert got is not None, "stepping reproduces every supported architecture"
    acts, grads = got
    want_acts, want_grads = ATP._whole_grads(model, batch, points, final, coef)
    assert set(grads) == set(want_grads) == set(points)
    for name in points:
        np.testing.assert_array_equal(acts[name].numpy(), want_acts[name].numpy())
        scale = float(want_grads[name].abs().max()) or 1.0
        np.testing.assert_allclose(grads[name].numpy(), want_grads[name].numpy(), rtol=1e-5, atol=1e-6 * scale)


def test_where_stepping_does_not_reproduce_the_model_the_whole_backward_is_used(tiny_root, monkeypatch):
    model = rl.load(str(tiny_root["llama"]))
    want = attribution_patch(model, DEMO_PAIRS[:3], level="head")
    whole = []
    monkeypatch.setattr(ATP, "_read_token_grads", lambda *a, **k: None)  # the read token alone: declined too
    monkeypatch.setattr(LAYERWISE, "_close", lambda *args: False)  # every layer's proof fails
    monkeypatch.setattr(ATP, "_whole_grads", lambda *a, **k: whole.append(1) or ATP_WHOLE(*a, **k))
    got = attribution_patch(model, DEMO_PAIRS[:3], level="head")
    assert whole, "the fall-back ran"
    np.testing.assert_allclose(got.effect, want.effect, rtol=1e-5, atol=1e-6)


ATP_WHOLE = ATP._whole_grads


# Where the read token alone cannot continue the clean cache, and why (the layer-at-a-time backward runs).
READ_TOKEN_DECLINES = {"bert": "encoder", "deberta-v2": "encoder", "roberta": "encoder",
                       "xlm-roberta": "encoder", "gemma3-mm": "a sliding window (8) shorter than the pairs"}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_read_token_alone_gives_the_whole_backwards_gradients_at_the_read_token(tiny_root, arch):
    """A causal decoder's read token is seen by no earlier position, so the read token alone, continuing
    the clean cache, has the exact gradient of the reward at every site there: equal to one backward
    through the whole forward, read at t*."""
    model = rl.load(str(tiny_root[arch]))
    batch, points, final, coef = _setup(model)
    keys = {s.key: s for s in sites(model, "head")}
    got = ATP._read_token_grads(model, batch, coef, keys)
    if arch in READ_TOKEN_DECLINES:
        assert got is None, READ_TOKEN_DECLINES[arch]
        return
    assert got is not None, "the continuation reproduces the clean read token on every causal decoder"
    acts, grads = got
    want_acts, want_grads = ATP._whole_grads(model, batch, points, final, coef)
    rows, at = torch.arange(batch.input_ids.shape[0]), batch.read_index
    for name in points:
        assert acts[name].shape[1] == 1, "one position: the read token"
        want_g = want_grads[name][rows, at]
        scale = float(want_g.abs().max()) or 1.0
        assert float(want_g.abs().max()) > 0 or name.kind == "embed", name
        np.testing.assert_allclose(acts[name][:, 0].numpy(), want_acts[name][rows, at].numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(grads[name][:, 0].numpy(), want_g.numpy(), rtol=1e-4, atol=1e-5 * scale)
