"""The fidelity check: explained variance and reward recovered, against hand computations on the HF model."""

import warnings

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.errors import RewardLensWarning
from rewardlens.sae import ActivationSource, SAEConfig, TopKSAE, attribute_features, fidelity
from tests.helpers import tiny


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def _bias_only(d, seed=0):
    """An SAE with a zero decoder: its reconstruction is `b_dec` whatever the input."""
    sae = TopKSAE(d, SAEConfig(num_latents=2 * d, k=4), seed=seed)
    with torch.no_grad():
        sae.W_dec.zero_()
        sae.b_dec.normal_(0, 0.5, generator=torch.Generator().manual_seed(seed))
    return sae


def _identity(d):
    """An SAE that reconstructs exactly: latents ReLU(x), ReLU(−x) decoded by ±e_i (k = d keeps them all)."""
    sae = TopKSAE(d, SAEConfig(num_latents=2 * d, k=d), seed=0)
    eye = torch.eye(d)
    with torch.no_grad():
        sae.encoder.weight.copy_(torch.cat([eye, -eye]))
        sae.encoder.bias.zero_()
        sae.W_dec.copy_(torch.cat([eye, -eye]))
        sae.b_dec.zero_()
    return sae


def _hf_rewards(model, inputs, layer, replace):
    """Each sequence's reward from one unpadded HF forward, its layer output at the last token set to
    `replace(x)` (None: untouched): the yardstick, with no rewardlens batching or hooks."""
    out = []

    def hook(_m, _a, o):
        h = o[0] if isinstance(o, tuple) else o
        if replace is not None:
            h = h.clone()
            h[0, -1] = replace(h[0, -1])
        return (h, *o[1:]) if isinstance(o, tuple) else h

    handle = model.model.model.layers[layer].register_forward_hook(hook)
    try:
        for kwargs in tiny.unpadded(model, inputs):
            with torch.no_grad():
                out.append(float(model.model(**kwargs).logits[0, 0]))
    finally:
        handle.remove()
    return np.array(out)


def test_a_bias_only_sae_recovers_what_a_hand_computation_says_and_warns(llama, pairs):
    sae = _bias_only(llama.d_model)
    b = sae.b_dec.detach()
    poor = r"explained variance -?\d+\.\d{3}, reward recovered .* under the floors"
    with pytest.warns(RewardLensWarning, match=poor):
        fit = fidelity(llama, sae, pairs, "resid_1", positions="read")
    x = torch.cat([c.x for c in ActivationSource(llama, pairs, "resid_1", positions="read")]).double()
    ev = 1 - float((x - b.double()).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    r = tiny.own_scores(llama, pairs)
    r_s = _hf_rewards(llama, pairs, 1, lambda h: b)
    r_0 = _hf_rewards(llama, pairs, 1, torch.zeros_like)
    assert fit.explained_variance == pytest.approx(ev, rel=1e-5) and fit.poor
    np.testing.assert_allclose(fit.reward, r, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fit.spliced, r_s, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fit.zeroed, r_0, rtol=1e-4, atol=1e-5)
    recovered = 1 - np.abs(r_s - r).mean() / np.abs(r_0 - r).mean()
    assert fit.reward_recovered == pytest.approx(recovered, rel=1e-4, abs=1e-5)
    assert (fit.point, fit.positions, fit.n_activations) == ("resid_1", "read", 2 * len(pairs))


def test_an_exact_sae_recovers_everything_at_every_position_and_is_silent(llama, pairs):
    sae = _identity(llama.d_model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RewardLensWarning)
        fit = fidelity(llama, sae, pairs, "resid_0", positions="all")
        att = attribute_features(llama, sae, pairs, layer=0, fit="all")
    n_tokens = sum(len(s.ids) - 1 for s in llama.encode(pairs)[0])  # a decoder's first token is left out
    assert fit.n_activations == n_tokens and fit.explained_variance == pytest.approx(1.0, abs=1e-6)
    assert fit.reward_recovered == pytest.approx(1.0, abs=1e-4) and not fit.poor
    np.testing.assert_allclose(fit.spliced, fit.reward, atol=1e-5)
    assert not np.allclose(fit.zeroed, fit.reward, atol=1e-3)  # zeroing every token does move the reward
    assert att.fidelity is not None and att.fidelity.explained_variance == pytest.approx(1.0, abs=1e-6)
    assert "explained variance 1.000, reward recovered 1.000" in att.fidelity.describe()


def test_attribution_carries_the_fit_and_warns_on_a_poor_sae(llama, pairs):
    with pytest.warns(RewardLensWarning, match="SAE fidelity at resid_1 .* POOR FIT"):
        att = attribute_features(llama, _bias_only(llama.d_model, seed=3), pairs, layer=1, fit="read")
    assert att.fidelity is not None and att.fidelity.poor and att.fidelity.positions == "read"
    assert attribute_features(llama, _identity(llama.d_model), pairs, layer=1, fit=None).fidelity is None


def test_a_poor_sae_trained_on_this_model_here_is_told_to_train_more_not_to_train_one_on_this_model(llama, pairs):
    from dataclasses import replace

    from rewardlens.sae._provenance import trained_provenance

    source = ActivationSource(llama, pairs, "resid_1", positions="read")
    ours = _bias_only(llama.d_model, seed=4)
    ours.provenance = trained_provenance(ours.provenance, source.origin())  # what train_sae records
    with pytest.warns(RewardLensWarning, match="POOR FIT") as got:
        fidelity(llama, ours, pairs, "resid_1", positions="read")
    text = str(got[0].message)
    assert "use an SAE trained on this model" not in text
    assert "trained on this model at resid_1 (positions='read'), so it needs more training" in text
    assert "--epochs" in text and "--latents" in text and "more data" in text
    # Trained here but measured at other positions: say so, rather than "train more".
    with pytest.warns(RewardLensWarning, match="POOR FIT") as got:
        fidelity(llama, ours, pairs, "resid_1", positions="all")
    assert "but at positions='read', and is measured at positions='all'" in str(got[0].message)
    # Another model's SAE (another fingerprint), or one at another point, keeps the advice to use one trained here.
    for other in (replace(ours.provenance, model_fingerprint="0" * 16), replace(ours.provenance, point="resid_0")):
        ours.provenance = other
        with pytest.warns(RewardLensWarning, match="POOR FIT") as got:
            fidelity(llama, ours, pairs, "resid_1", positions="read")
        assert "use an SAE trained on this model at resid_1 (positions='read'" in str(got[0].message)
