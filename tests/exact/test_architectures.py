"""Closure and scoring on every supported architecture, checked against the model's own forward."""

import numpy as np
import pytest
import torch

import rewardlens as rl
from tests.helpers.tiny import ARCHS, own_scores


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tiny_root):
    return rl.load(str(tiny_root[request.param]))


def test_score_equals_models_own_logits_any_batch_and_padding(model, pairs):
    theirs = own_scores(model, pairs)
    assert np.abs(theirs).max() > 1e-3, "degenerate test model: rewards are ~0"
    for batch_size in (1, 2, 6):
        for side in ("right", "left"):
            ours = model.score(pairs, batch_size=batch_size, padding_side=side)
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * np.abs(theirs).max())


@pytest.mark.parametrize("level", ["sublayer", "head", "neuron"])
def test_parts_plus_constant_equal_reward(model, pairs, level):
    att = rl.attribute(model, pairs, level=level, batch_size=4)
    np.testing.assert_allclose(att.reward, model.score(pairs), rtol=1e-5, atol=1e-5 * np.abs(att.reward).max())
    scale = np.abs(att.values).sum(1) + np.abs(att.constant)
    assert (np.abs(att.residual_error) <= 1e-4 * scale).all(), att.residual_error
    # Per objective too (ArmoRM's raw objective rows, before the gate).
    obj_err = att.objective_reward - att.per_objective.sum(-1) - att.objective_constant
    assert (np.abs(obj_err) <= 1e-4 * (np.abs(att.per_objective).sum(-1) + 1e-3)).all()


def test_heads_and_neurons_sum_to_their_sublayer(model, pairs):
    sub = rl.attribute(model, pairs, level="sublayer")
    col = {n: i for i, n in enumerate(sub.names)}
    for level, kind in (("head", "attn"), ("neuron", "mlp")):
        fine = rl.attribute(model, pairs, level=level)
        for layer in range(model.n_layers):
            whole = f"{kind}_L{layer}"
            members = [i for i, n in enumerate(fine.names) if n.startswith(whole + "_")]
            assert len(members) >= (model.n_heads if kind == "attn" else 2)
            np.testing.assert_allclose(
                fine.values[:, members].sum(1), sub.values[:, col[whole]], rtol=1e-4, atol=1e-6
            )


def test_both_lenses_end_at_the_reward(model, pairs):
    ln = rl.lens(model, pairs)
    assert ln.linear.shape == (2 * len(pairs), model.n_layers + 1)
    np.testing.assert_allclose(ln.linear[:, -1], ln.reward, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ln.normed[:, -1], ln.reward, rtol=1e-4, atol=1e-6)
    depth = ln.crystallization()
    assert depth.shape == (len(pairs),)
    assert np.all(np.isnan(depth) | ((depth >= 0) & (depth <= 1)))


def test_model_is_never_modified(model, pairs):
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    model.model.train()  # the user's flag must survive a traced run
    rl.attribute(model, pairs, level="head")
    assert model.model.training
    model.model.eval()
    after = model.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.model.modules())
