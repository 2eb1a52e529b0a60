"""SAE feature interventions and steering, against independent yardsticks (one hooked Hugging Face
forward per input and edit; a hand-computed slope)."""

import json
import math
import shutil

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.errors import ArchitectureError, DataError
from rewardlens.sae import SAEConfig, TopKSAE, attribute_features, feature_patch, feature_steer
from tests.helpers import tiny

SMALL = SAEConfig(expansion_factor=4, k=8)
ARCHS = ["llama", "gpt2", "bert"]  # a Llama-like decoder, a GPT-2-like decoder, a post-norm encoder


@pytest.fixture(scope="module")
def models(tiny_root):
    return {arch: rl.load(str(tiny_root[arch])) for arch in ARCHS}


def _sae(model):
    return TopKSAE(model.d_model, SMALL, seed=1)


def _hooked(model, pairs, layer, edit):
    """The reward of each sequence with `edit(x)` [d] replacing layer `layer`'s output `x` at the read token
    (last token of a decoder, first of an encoder): one unpadded hooked HF forward each."""
    module = model.layers[layer]
    out = []
    for kwargs in tiny.unpadded(model, pairs):
        t = 0 if model.encoder else kwargs["input_ids"].shape[1] - 1

        def hook(_m, _a, o, t=t):
            h = (o[0] if isinstance(o, tuple) else o).clone()
            h[0, t] = edit(h[0, t])
            return (h, *o[1:]) if isinstance(o, tuple) else h

        handle = module.register_forward_hook(hook)
        try:
            with torch.no_grad():
                res = model.model(**kwargs)
        finally:
            handle.remove()
        score = getattr(res, "score", None)
        out.append(float(score[0]) if score is not None else float(res.logits[0, 0]))
    return np.array(out)


def _naive(model, sae, pairs, layer, features):
    """`_hooked` with `Σ_{i ∈ features} f_i d_i` removed, every activation encoded here from the hooked hidden
    state (a latent outside the top k has f_i = 0)."""
    features = [features] if np.ndim(features) == 0 else list(features)

    def edit(x):
        f = torch.relu((x - sae.b_dec) @ sae.encoder.weight.T + sae.encoder.bias)
        top = f.topk(sae.k)
        for i in features:
            x = x - top.values[top.indices == int(i)].sum() * sae.W_dec[int(i)]
        return x

    return _hooked(model, pairs, layer, edit)


@pytest.mark.parametrize("arch", ARCHS)
def test_nothing_changed_reproduces_the_reward_and_one_ablation_equals_a_naive_hooked_loop(models, pairs, arch):
    model = models[arch]
    sae = _sae(model)
    layer = 0
    own = tiny.own_scores(model, pairs)
    scale = np.abs(own).max()
    att = attribute_features(model, sae, pairs, layer=layer)
    silent = [i for i in range(sae.n_latents) if i not in set(att.features)][:3]  # never fire: f = f' = 0
    res = feature_patch(model, sae, pairs, layer=layer, features=[*att.features[:4].tolist(), *silent])
    np.testing.assert_allclose(res.clean, own, rtol=0, atol=1e-5 * scale)
    # The edit adds exactly 0 there: the stacked run differs from the clean one by float rounding only.
    np.testing.assert_allclose(res.patched[:, 4:], np.repeat(res.clean[:, None], 3, 1), rtol=0, atol=1e-6 * scale)
    assert np.abs(res.total[:, 4:]).max() <= 1e-6 * scale
    with torch.no_grad():
        for j, feature in enumerate(att.features[:4]):
            np.testing.assert_allclose(res.patched[:, j], _naive(model, sae, pairs, layer, int(feature)),
                                       rtol=0, atol=2e-6 * scale)
    # Ablation's direct effect is the feature's own direct margin contribution.
    np.testing.assert_allclose(res.direct[:, :4], att.margin[:, :4], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(res.indirect, res.total - res.direct)
    assert np.abs(res.total[:, :4]).max() > 5e-4 * scale  # well above the tolerance above


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode,value", [("ablate", None), ("clamp", 1.5), ("noising", None)])
def test_the_batched_path_equals_one_edit_per_forward(models, pairs, arch, mode, value):
    model = models[arch]
    sae = _sae(model)
    kw = dict(layer=1, edit=mode, value=value)
    batched = feature_patch(model, sae, pairs, batch_size=64, **kw)
    single = feature_patch(model, sae, pairs, features=batched.features, batch_size=1, **kw)
    np.testing.assert_allclose(batched.patched, single.patched, rtol=0, atol=1e-5 * np.abs(single.clean).max())
    assert len(batched.features) > 3 and np.abs(batched.total).max() > 0


def test_clamp_and_noising_direct_effects_are_the_attribution_difference(models, pairs):
    model = models["llama"]
    sae = _sae(model)
    att = attribute_features(model, sae, pairs, layer=1)
    features = att.features[:5]
    write = att.values[:, :5] / np.where(att.activations[:, :5] > 0, att.activations[:, :5], np.nan)  # u·d_i
    clamp = feature_patch(model, sae, pairs, layer=1, features=features, edit="clamp", value=2.0)
    f = att.activations[:, :5]
    fired = np.isfinite(write[0::2]) & np.isfinite(write[1::2])
    by_hand = -((2.0 - f[0::2]) * write[0::2] - (2.0 - f[1::2]) * write[1::2])
    np.testing.assert_allclose(clamp.direct[fired], by_hand[fired], rtol=1e-4, atol=1e-5)
    noise = feature_patch(model, sae, pairs, layer=1, features=features, edit="noising")
    chosen_fired = np.isfinite(write[0::2])
    np.testing.assert_allclose(noise.direct[chosen_fired],
                               ((f[0::2] - f[1::2]) * write[0::2])[chosen_fired], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(noise.patched[1::2], np.repeat(noise.clean[1::2, None], 5, 1))  # rejected not run
    mean, lo, hi = clamp.faithfulness()
    rho = clamp.rho
    assert mean == pytest.approx(np.nanmean(rho)) and lo <= mean <= hi
    assert [fid for fid, _ in clamp.top(2)] == [int(features[i]) for i in np.argsort(-np.abs(clamp.total).mean(0))[:2]]
    frame = clamp.to_frame()
    assert len(frame) == 5 * len(pairs) and set(frame.columns) >= {"total", "direct", "indirect", "attribution"}


@pytest.mark.parametrize("mode,value", [("ablate", None), ("clamp", 1.5), ("noising", None)])
def test_a_group_of_one_is_the_single_feature_path(models, pairs, mode, value):
    model = models["gpt2"]
    sae = _sae(model)
    single = feature_patch(model, sae, pairs, layer=0, edit=mode, value=value, features=None)
    ids = single.features.tolist()
    grouped = feature_patch(model, sae, pairs, layer=0, edit=mode, value=value, groups=[[i] for i in ids])
    for name in ("patched", "total", "direct", "attribution"):
        np.testing.assert_array_equal(getattr(grouped, name), getattr(single, name), err_msg=name)
    assert grouped.groups == tuple((i,) for i in ids) and grouped.names == [str(i) for i in ids]
    assert grouped.grouped and not single.grouped and single.groups == grouped.groups
    assert [fid for fid, _ in single.top(2)] == [int(f) for f, _ in grouped.top(2)]  # ids, then names


@pytest.mark.parametrize("arch", ARCHS)
def test_a_group_edits_its_members_jointly_as_a_naive_hooked_loop_does(models, pairs, arch):
    model = models[arch]
    sae = _sae(model)
    layer = 0
    att = attribute_features(model, sae, pairs, layer=layer)
    top = [f for f, _ in att.top(5, by="margin")]
    groups = [top[:3], top[3:], top[:1]]
    res = feature_patch(model, sae, pairs, layer=layer, groups=groups)
    scale = np.abs(res.clean).max()
    for j, group in enumerate(groups):
        np.testing.assert_allclose(res.patched[:, j], _naive(model, sae, pairs, layer, group), rtol=0,
                                   atol=2e-6 * scale)
    assert res.names == ["+".join(map(str, top[:3])), "+".join(map(str, top[3:])), str(top[0])]
    assert res.groups == (tuple(top[:3]), tuple(top[3:]), (top[0],))
    assert res.features.tolist() == [top[0], top[3], top[0]]  # each group's first member
    # Direct effect and attribution are the members' sums (the read-out is linear); for ablation both are the
    # members' margin attribution.
    col = {int(f): i for i, f in enumerate(att.features)}
    by_hand = np.stack([att.margin[:, [col[i] for i in g]].sum(1) for g in groups], 1)
    np.testing.assert_allclose(res.direct, by_hand, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(res.attribution, by_hand, rtol=1e-5, atol=1e-7)
    # The joint edit is not the sum of the single edits once later layers respond.
    single = feature_patch(model, sae, pairs, layer=layer, features=top)
    assert np.abs(res.total[:, 0] - single.total[:, :3].sum(1)).max() > 1e-5 * scale  # 5× the tolerance above
    for mode, value in (("clamp", 2.0), ("noising", None)):
        one = feature_patch(model, sae, pairs, layer=layer, features=top, edit=mode, value=value)
        joint = feature_patch(model, sae, pairs, layer=layer, groups=groups[:2], edit=mode, value=value)
        np.testing.assert_allclose(joint.direct, np.stack([one.direct[:, :3].sum(1), one.direct[:, 3:].sum(1)], 1),
                                   rtol=1e-6, atol=1e-9)
    frame = res.to_frame()
    assert list(frame["feature"][:3]) == res.names


@pytest.mark.parametrize("arch", ARCHS)
def test_ablating_every_active_feature_leaves_the_error_term_alone(models, pairs, arch):
    """With every latent that fires at any read token ablated, `x' = x − (x̂ − b_dec) = b_dec + ε`: the SAE's
    reconstruction is removed and its error term kept (computed here from the SAE's own forward)."""
    model = models[arch]
    sae = _sae(model)
    layer = 1
    att = attribute_features(model, sae, pairs, layer=layer)
    res = feature_patch(model, sae, pairs, layer=layer, groups=[att.features.tolist()])
    with torch.no_grad():
        want = _hooked(model, pairs, layer, lambda x: x - (sae(x[None]).x_hat[0] - sae.b_dec))
    scale = np.abs(res.clean).max()
    np.testing.assert_allclose(res.patched[:, 0], want, rtol=0, atol=2e-6 * scale)
    assert np.abs(res.patched[:, 0] - res.clean).max() > 1e-3 * scale  # the reconstruction mattered
    np.testing.assert_allclose(res.direct[:, 0], att.margin.sum(1), rtol=1e-5, atol=1e-6)


def test_bad_groups_get_one_line_each(models, pairs):
    model = models["llama"]
    sae = _sae(model)
    n = sae.n_latents
    for groups, message in (
        ([[0, 3, 3]], r"group 0 \[0, 3, 3\] name a latent twice; pass each latent id once"),
        ([[0], [2, n]], rf"feature {n} is out of range .* 0\.\.{n - 1}"),
        ([0, 1], r"group 0 must be a list of latent ids, got 0; pass e\.g\. groups=\[\[3, 17\], \[5\]\]"),
        ([], r"groups= is a list of groups of latent ids, got \[\]"),
        ([[0.5]], r"group 0 are latent ids \(integers\), got \[0\.5\]"),
    ):
        with pytest.raises(DataError, match=message):
            feature_patch(model, sae, pairs, layer=0, groups=groups)
    with pytest.raises(DataError, match=r"pass features= .* or groups= .*, not both"):
        feature_patch(model, sae, pairs, layer=0, features=[0], groups=[[0]])


def test_bad_input_gets_one_line_naming_the_value_and_the_fix(models, pairs):
    model = models["llama"]
    sae = _sae(model)
    with pytest.raises(DataError, match=rf"feature {sae.n_latents} is out of range .* 0\.\.{sae.n_latents - 1}"):
        feature_patch(model, sae, pairs, layer=0, features=[0, sae.n_latents])
    with pytest.raises(DataError, match=r"finite value= .* got nan"):
        feature_patch(model, sae, pairs, layer=0, features=[0], edit="clamp", value=math.nan)
    with pytest.raises(DataError, match=r"edit must be 'ablate', 'clamp' or 'noising', got 'zero'"):
        feature_patch(model, sae, pairs, layer=0, features=[0], edit="zero")
    with pytest.raises(DataError, match=r"pass a list of rewardlens.Pair"):
        feature_patch(model, sae, ["a text"], layer=0, features=[0])
    wide = TopKSAE(model.d_model + 8, SMALL, seed=0)
    for call in (lambda: feature_patch(model, wide, pairs, layer=0, features=[0]),
                 lambda: feature_steer(model, wide, pairs, layer=0, feature=0)):
        with pytest.raises(ArchitectureError, match=rf"width {model.d_model + 8} .* width {model.d_model}"):
            call()
    with pytest.raises(DataError, match=r"feature -1 is out of range"):
        feature_steer(model, sae, pairs, layer=0, feature=-1)
    with pytest.raises(DataError, match=r"doses must be finite"):
        feature_steer(model, sae, pairs, layer=0, feature=0, doses=[0.0, math.inf])


@pytest.mark.parametrize("arch", ARCHS)
def test_steering_at_dose_zero_is_the_clean_reward_and_batches_like_one_dose_a_forward(models, pairs, arch):
    model = models[arch]
    sae = _sae(model)
    res = feature_steer(model, sae, pairs, layer=1, feature=3, doses=(-1.0, 1.0, 2.0), positions="all")
    one = feature_steer(model, sae, pairs, layer=1, feature=3, doses=(-1.0, 1.0, 2.0), positions="all", batch_size=1)
    own = tiny.own_scores(model, pairs)
    np.testing.assert_allclose(res.base, own, rtol=0, atol=1e-5 * np.abs(own).max())
    assert list(res.alphas) == [-1.0, 0.0, 1.0, 2.0] and np.all(res.dose[1] == 0)
    np.testing.assert_allclose(res.dose, one.dose, rtol=0, atol=1e-5 * np.abs(own).max())
    assert np.abs(res.dose).max() > 0


def test_steering_slope_on_a_linear_read_out_equals_the_hand_computation(tmp_path, tiny_root, pairs):
    """A Llama whose final RMSNorm has an epsilon (1e6) far above the residual's mean square: the norm is a
    constant scale, so at the last layer's read token the reward is linear in α with slope
    (w ⊙ γ) · d / sqrt(mean(x²) + eps), computed here from the HF modules."""
    folder = tmp_path / "llama_eps"
    shutil.copytree(tiny_root["llama"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e6}))
    model = rl.load(str(folder))
    hf = model.model
    sae = _sae(model)
    feature, layer = 5, model.n_layers - 1
    res = feature_steer(model, sae, pairs, layer=layer, feature=feature, doses=(-2.0, -1.0, 1.0, 2.0))
    d = sae.W_dec.detach()[feature]
    hand = []
    for kwargs in tiny.unpadded(model, pairs):
        got = []
        handle = hf.model.norm.register_forward_pre_hook(lambda _m, a, got=got: got.append(a[0][0, -1]))
        with torch.no_grad():
            hf(**kwargs)
        handle.remove()
        w = hf.score.weight[0] * hf.model.norm.weight
        hand.append(float(w.detach() @ d / torch.sqrt(got[0].pow(2).mean() + 1e6)))
    np.testing.assert_allclose(res.slopes, hand, rtol=1e-3)
    assert res.slope == pytest.approx(np.mean(hand), rel=1e-3)
    lo, hi = res.slope_ci
    assert lo <= res.slope <= hi and abs(res.slope) > 0


def test_a_nan_faithfulness_says_why_and_what_to_do(models, pairs):
    from rewardlens.errors import RewardLensWarning

    model = models["llama"]
    sae = _sae(model)
    fired = attribute_features(model, sae, pairs, layer=1, fit=None)
    never = sorted(set(range(sae.n_latents)) - {int(i) for i in fired.features})[:2]
    busy = [latent for latent, _ in fired.top(3, by="margin")]
    cases = [  # (patch, words the reason must hold): one column; columns that never fire; one pair with a ρ
        (feature_patch(model, sae, pairs, layer=1, features=busy[:1], approx=False), "there is 1, so it is undefined"),
        (feature_patch(model, sae, pairs, layer=1, features=never, approx=False), "features that never fired"),
        (feature_patch(model, sae, pairs[:1], layer=1, features=busy, approx=False), "a bootstrap interval over pairs"),
    ]
    for res, words in cases:
        assert words in res.faithfulness_note
        with pytest.warns(RewardLensWarning, match="feature_patch faithfulness: .*(patch|pass) "):
            mean, lo, hi = res.faithfulness()
        assert math.isnan(lo) and math.isnan(hi)
        # Spearman's definition: a pair's ρ exists where neither its attribution nor its total row is constant.
        by_hand = [res.total.shape[1] > 1 and np.ptp(a) > 0 and np.ptp(t) > 0
                   for a, t in zip(res.attribution, res.total)]
        assert [math.isfinite(r) for r in res.rho] == by_hand and math.isnan(mean) == (not any(by_hand))
    good = feature_patch(model, sae, pairs, layer=1, features=busy, approx=False)
    assert np.isfinite(good.rho).sum() >= 2 and good.faithfulness_note == ""
