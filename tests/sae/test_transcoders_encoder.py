"""Transcoders on a post-norm encoder (BERT), whose MLP is no one module: trained on what `intermediate` receives
(the MLP input) and what `output.dense` returns (the MLP output, before dropout, the residual and the LayerNorm).

Yardsticks written here: hooks on those two modules by their Hugging Face paths, and Hugging Face's own logits
with `output.dense`'s output replaced by the transcoder's."""


import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.sae import TranscoderTrainConfig, load_transcoders, train_transcoders, transcoder_fidelity
from rewardlens.sae.internal import mlp_modules
from tests.helpers.tiny import own_scores, unpadded
from tests.sae.test_transcoders import assert_explained_variance


@pytest.fixture(scope="module")
def bert(tiny_root):
    return rl.load(str(tiny_root["bert"]))


def _layer(model, layer):
    return model.model.bert.encoder.layer[layer]


def _naive_mlp_io(model, pairs, layer):
    """MLP input and output of `layer` at every token (an encoder skips none), by hooks written here."""
    xs, ys = [], []
    block = _layer(model, layer)
    hooks = [block.intermediate.register_forward_pre_hook(lambda m, a: xs.append(a[0][0])),
             block.output.dense.register_forward_hook(lambda m, a, o: ys.append(o[0]))]
    try:
        with torch.no_grad():
            for kwargs in unpadded(model, pairs):
                model.model(**kwargs)
    finally:
        for h in hooks:
            h.remove()
    return torch.cat(xs).float(), torch.cat(ys).float()


def test_encoder_mlp_points_are_the_intermediate_input_and_the_down_projection_output(bert):
    for layer in range(bert.n_layers):
        assert mlp_modules(bert, layer) == (_layer(bert, layer).intermediate, _layer(bert, layer).output.dense)


def test_encoder_transcoders_train_and_their_fidelity_matches_hooks_and_hf_logits(bert, pairs, tmp_path):
    before = {k: v.clone() for k, v in bert.model.state_dict().items()}
    res = train_transcoders(bert, list(pairs) * 4, config=TranscoderTrainConfig(
        d_sae=128, k=8, batch_size=64, buffer_rows=256, epochs=1, lr=3e-3, lr_warmup_steps=2))
    assert all(torch.equal(before[k], v) for k, v in bert.model.state_dict().items())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in bert.model.modules())
    tcs = res.transcoders
    assert tcs.layers == tuple(range(bert.n_layers))
    assert all(len(h) >= 4 and h[-1] < h[0] for h in res.fvu.values())  # the loss went down
    fit = transcoder_fidelity(bert, tcs, pairs)
    np.testing.assert_allclose(fit.reward, own_scores(bert, pairs), rtol=1e-5, atol=1e-6)
    assert_explained_variance(fit, tcs, lambda layer: _naive_mlp_io(bert, pairs, layer))
    # The reward with every MLP replaced (every token), by hooks written here on Hugging Face's own forward.
    seen: dict[int, torch.Tensor] = {}
    hooks = []
    for la in tcs.layers:
        hooks.append(_layer(bert, la).intermediate.register_forward_pre_hook(
            lambda m, a, la=la: seen.__setitem__(la, a[0])))
        hooks.append(_layer(bert, la).output.dense.register_forward_hook(
            lambda m, a, o, la=la: tcs[la](seen[la]).to(o.dtype)))
    replaced = []
    try:
        with torch.no_grad():
            for kwargs in unpadded(bert, pairs):
                replaced.append(float(bert.model(**kwargs).logits[0, 0]))
    finally:
        for h in hooks:
            h.remove()
    np.testing.assert_allclose(fit.replaced, replaced, rtol=1e-4, atol=1e-5)
    assert np.isfinite(fit.reward_recovered)
    # saved and read back, they pass the provenance checks against this encoder and measure the same
    again = transcoder_fidelity(bert, load_transcoders(tcs.save(tmp_path / "tcs")), pairs)
    np.testing.assert_allclose(again.replaced, fit.replaced, rtol=1e-6)
