"""Attribution patching's backward one layer at a time: the same gradients as one backward through the
whole forward (the chain rule, checked on every architecture), and a fall-back to the whole backward
where stepping does not reproduce the model. The memory it saves is measured by benchmarks/audit.py."""

import importlib

import numpy as np
import pytest

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
    monkeypatch.setattr(LAYERWISE, "_close", lambda *args: False)  # every layer's proof fails
    monkeypatch.setattr(ATP, "_whole_grads", lambda *a, **k: whole.append(1) or ATP_WHOLE(*a, **k))
    got = attribution_patch(model, DEMO_PAIRS[:3], level="head")
    assert whole, "the fall-back ran"
    np.testing.assert_allclose(got.effect, want.effect, rtol=1e-5, atol=1e-6)


ATP_WHOLE = ATP._whole_grads
