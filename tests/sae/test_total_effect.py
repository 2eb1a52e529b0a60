"""First-order total effects of SAE features (attribution patching over features) against independent yardsticks:
a naive per-feature autograd through a hooked Hugging Face forward with the feature spliced in, autograd-free
central differences of the model's own reward, and, on a read-out made linear, the measured ablation itself.
And on a planted upstream feature (direct attribution 0, ablation moves the margin) the total ranking finds it
where the direct one cannot. The empty edit gives back the clean reward."""

import copy
import json
import shutil

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import DataError
from rewardlens.sae import SAEConfig, TopKSAE, attribute_features, feature_patch, feature_report, feature_totals
from rewardlens.sae._attribution import attribute_with_readout
from tests.helpers import tiny

SMALL = SAEConfig(expansion_factor=4, k=8)
ARCHS = ["llama", "gpt2", "bert"]


@pytest.fixture(scope="module")
def models(tiny_root):
    return {arch: rl.load(str(tiny_root[arch])) for arch in ARCHS}


def _reward(model, kwargs, layer, edit, hf=None):
    """The HF model's own reward of one unpadded sequence with `edit(h)` [d] replacing layer `layer`'s output at
    the read token (last token of a decoder, first of an encoder); `hf`: a copy of the HF model to run instead."""
    t = 0 if model.encoder else kwargs["input_ids"].shape[1] - 1

    def hook(_m, _a, o):
        h = (o[0] if isinstance(o, tuple) else o).clone()
        h[0, t] = edit(h[0, t])
        return (h, *o[1:]) if isinstance(o, tuple) else h

    name = next(n for n, m in model.model.named_modules() if m is model.layers[layer])
    hf = model.model if hf is None else hf
    handle = dict(hf.named_modules())[name].register_forward_hook(hook)
    try:
        res = hf(**kwargs)
    finally:
        handle.remove()
    score = getattr(res, "score", None)
    return score[0] if score is not None else res.logits[0, 0]


def _naive_grads(model, sae, pairs, layer, latents):
    """∂r/∂f_i [n, len(latents)], one autograd per sequence and latent: the SAE spliced in at the read token with its
    error kept (x = x̂(f) + (x − x̂(f₀))), f_i a leaf at its clean value."""
    out = []
    for kwargs in tiny.unpadded(model, pairs):
        row = []
        for i in latents:
            leaf = {}

            def edit(x, i=i, leaf=leaf):
                f = torch.relu((x - sae.b_dec) @ sae.encoder.weight.T + sae.encoder.bias)
                top = f.topk(sae.k)
                f0 = top.values[top.indices == i].sum().detach()
                leaf["f"] = f0.clone().requires_grad_()
                return x + (leaf["f"] - f0) * sae.W_dec[i].detach()

            with torch.enable_grad():
                r = _reward(model, kwargs, layer, edit)
                (g,) = torch.autograd.grad(r, leaf["f"])
            row.append(float(g))
        out.append(row)
    return np.array(out)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_gradient_of_every_feature_equals_a_naive_autograd_through_the_spliced_sae(models, pairs, arch):
    model = models[arch]
    sae = TopKSAE(model.d_model, SMALL, seed=1)
    tot = feature_totals(model, sae, pairs, layer=0)
    np.testing.assert_allclose(tot.reward, tiny.own_scores(model, pairs), rtol=0, atol=1e-5)
    latents = [int(i) for i in tot.features[:5]]
    naive = _naive_grads(model, sae, pairs, 0, latents)
    ours = tot.gradient.astype(np.float64) @ sae.W_dec.detach().double().numpy()[latents].T
    np.testing.assert_allclose(ours, naive, rtol=1e-4, atol=1e-6 * np.abs(naive).max())
    np.testing.assert_allclose(tot.total_approx[:, :5], tot.activations[:, :5] * naive, rtol=1e-4, atol=1e-6)
    # The fired set and activations are the attribution's (same inputs, same read token).
    att = attribute_features(model, sae, pairs, layer=0, fit=None)
    assert np.array_equal(att.features, tot.features)
    np.testing.assert_array_equal(att.activations, tot.activations)


def test_the_gradient_equals_central_differences_of_the_models_own_reward(models, pairs):
    """No autograd in the yardstick: central differences D(h) = (r(x + h d_i) − r(x − h d_i)) / 2h at the read token
    of layer 0 on a float64 copy of the HF model (whose RMSNorm still computes in float32, so h cannot be tiny),
    extrapolated as (4 D(h/2) − D(h)) / 3 to cancel the h² term."""
    model = models["llama"]
    sae = TopKSAE(model.d_model, SMALL, seed=2)
    tot = feature_totals(model, sae, pairs, layer=0)
    hf64 = copy.deepcopy(model.model).double()

    def central(d, h):
        with torch.no_grad():
            return np.array([(float(_reward(model, kw, 0, lambda x: x + h * d, hf64)) -
                              float(_reward(model, kw, 0, lambda x: x - h * d, hf64))) / (2 * h)
                             for kw in tiny.unpadded(model, pairs)])

    for j in range(3):
        d = sae.W_dec.detach()[int(tot.features[j])].double()
        fd = (4 * central(d, 5e-3) - central(d, 1e-2)) / 3
        np.testing.assert_allclose(tot.gradient.astype(np.float64) @ d.numpy(), fd, rtol=2e-4, atol=1e-6)


def test_on_a_linear_read_out_the_first_order_estimate_is_the_measured_effect(tmp_path, tiny_root, pairs):
    """At the last layer of a Llama whose final norm is a constant scale (eps 1e6 far above the residual's mean
    square) the reward is affine in the residual, so first order is exact. The rewards there are ~3e-5, so the
    edit is a clamp to 100 (its reward change far above float rounding, its change of mean(x²) far below eps)."""
    folder = tmp_path / "llama_eps"
    shutil.copytree(tiny_root["llama"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e6}))
    model = rl.load(str(folder))
    sae = TopKSAE(model.d_model, SMALL, seed=1)
    layer = model.n_layers - 1
    res = feature_patch(model, sae, pairs, layer=layer, edit="clamp", value=100.0, approx=True)
    tot = feature_totals(model, sae, pairs, layer=layer)
    f = np.zeros((len(res.clean), sae.n_latents))
    f[:, tot.features] = tot.activations
    d = sae.W_dec.detach().double().numpy()[res.features]  # [F, d]
    first = (100.0 - f[:, res.features]) * (tot.gradient.astype(np.float64) @ d.T)  # per side [n, F]
    measured = res.patched - res.clean[:, None]
    assert np.abs(measured).max() > 1e-3  # far above the ~1e-11 rounding of these rewards
    np.testing.assert_allclose(first, measured, rtol=1e-3, atol=0)
    np.testing.assert_allclose(res.total_approx, -(first[0::2] - first[1::2]), rtol=1e-6, atol=1e-12)


def _planted(model, pairs, layer):
    """A random SAE at `layer` with latent 0 planted: it fires at every read token with activation C, and its
    decoder row is orthogonal to every input's direct read-out `u_l` (direct attribution 0) but along the mean
    chosen − rejected difference of the reward's gradient there (so it moves the margin through later layers)."""
    sae = TopKSAE(model.d_model, SMALL, seed=3)
    _, readout = attribute_with_readout(model, sae, pairs, layer=layer)
    grad = feature_totals(model, sae, pairs, layer=layer).gradient
    q, _ = np.linalg.qr(readout.T.astype(np.float64))  # an orthonormal basis of the read-outs' span
    diff = (grad[0::2] - grad[1::2]).mean(0).astype(np.float64)
    d = diff - q @ (q.T @ diff)
    with torch.no_grad():
        seqs_x = attribute_with_readout(model, sae, pairs, layer=layer)[0].activations
        sae.W_dec[0] = torch.as_tensor(d / np.linalg.norm(d), dtype=torch.float32)
        sae.encoder.weight[0] = 0.0
        sae.encoder.bias[0] = 2.0 + float(seqs_x.max())  # above every other latent: always in the top k
    return sae


def test_a_planted_upstream_feature_is_found_by_the_total_ranking_not_the_direct_one(models, pairs):
    model = models["llama"]
    sae = _planted(model, pairs, layer=0)
    att = attribute_features(model, sae, pairs, layer=0, fit=None)
    col = int(np.searchsorted(att.features, 0))
    assert att.features[col] == 0 and (att.activations[:, col] > 0).all()
    scale = np.abs(att.reward).max()
    assert np.abs(att.values[:, col]).max() < 1e-5 * scale  # it writes nothing directly (float rounding only)
    direct_order = [f for f, _ in att.top(len(att.features), by="margin")]
    assert direct_order.index(0) >= len(direct_order) // 2
    tot = feature_totals(model, sae, pairs, layer=0)
    assert tot.top(1, by="margin")[0][0] == 0
    res = feature_patch(model, sae, pairs, layer=0, rank="total_approx", edit="ablate")
    assert res.features[0] == 0
    margin = res.clean[0::2] - res.clean[1::2]
    assert abs(res.total[:, 0].mean()) > 0.05 * np.abs(margin).mean()  # its ablation moves the margin
    assert abs(res.direct[:, 0]).max() < 1e-5 * scale  # through later layers only
    assert np.sign(res.total_approx[:, 0].mean()) == np.sign(res.total[:, 0].mean())
    by_direct = feature_patch(model, sae, pairs, layer=0, approx=False).features.tolist()
    assert by_direct.index(0) == len(by_direct) - 1  # the direct default ranks it last of those that fired


def test_the_empty_edit_gives_back_the_clean_reward_and_no_features_is_refused_by_name(models, pairs):
    model = models["llama"]
    sae = TopKSAE(model.d_model, SMALL, seed=1)
    own = tiny.own_scores(model, pairs)
    for mode, value in (("ablate", None), ("clamp", 1.5), ("noising", None)):
        res = feature_patch(model, sae, pairs, layer=0, groups=[[], [3]], edit=mode, value=value, approx=True)
        assert res.names == ["none", "3"] and res.features.tolist() == [-1, 3]
        np.testing.assert_array_equal(res.patched[:, 0], res.clean)  # nothing edited: the clean run, exactly
        np.testing.assert_allclose(res.clean, own, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(res.patched[0::2, 0] - res.patched[1::2, 0], res.clean[0::2] - res.clean[1::2])
        for effect in (res.total, res.direct, res.attribution, res.total_approx):
            assert np.all(effect[:, 0] == 0)
    with pytest.raises(DataError, match=r"features=\[\] names no latent, .* groups=\[\[\]\] for the empty edit"):
        feature_patch(model, sae, pairs, layer=0, features=[], edit="ablate")
    with pytest.raises(DataError, match=r"rank must be 'direct' or 'total_approx', got 'total'"):
        feature_patch(model, sae, pairs, layer=0, rank="total")


def test_reports_and_the_command_line_rank_by_the_total_when_asked(capsys, tmp_path, models, tiny_root, pairs):
    model = models["llama"]
    sae = _planted(model, pairs, layer=0)
    att = attribute_features(model, sae, pairs, layer=0, fit=None)
    tot = feature_totals(model, sae, pairs, layer=0)
    report = feature_report(model, sae, att, pairs, top=3, n_contexts=1, ranking=tot)
    assert report.score_kind == "total_approx" and report.features[0] == 0
    assert report.cards.cards[0].score == pytest.approx(float(tot.margin[:, 0].mean()))
    assert 0 not in feature_report(model, sae, att, pairs, top=3, n_contexts=1).features
    with pytest.raises(DataError, match=r"ranking= is a FeatureTotals of 4 inputs at layer 0, the attribution one "
                                        r"of 6 at layer 0.*compute both on the same inputs and layer"):
        feature_report(model, sae, att, pairs, top=3, ranking=feature_totals(model, sae, pairs[:2], layer=0))
    sae.save(tmp_path / "saes" / "layers.0")
    pairs_file = str(save_pairs(pairs, tmp_path / "p.jsonl"))
    args = [str(tiny_root["llama"]), "--sae", str(tmp_path / "saes" / "layers.0"), "--pairs", pairs_file,
            "--sae-any-model", "--top", "3", "--rank", "total_approx"]
    assert main(["sae", "attribute", *args, "--json", "--contexts", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["top_features"][0]["feature"] == 0 and out["rank"] == "total_approx"
    assert out["top_features"][0]["total_approx"] == pytest.approx(float(tot.margin[:, 0].mean()), rel=1e-5)
    assert main(["sae", "report", *args, "--contexts", "1", "--out", str(tmp_path / "page.html")]) == 0
    printed = capsys.readouterr().out
    assert "mean margin, total_approx" in printed and printed.split("\n")[3].split()[0] == "0"
