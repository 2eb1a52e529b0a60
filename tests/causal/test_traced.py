"""Compute once (issue 15): one traced forward serves the lens, both attribution levels and every
patching estimand, and the numbers equal each instrument run on its own to float precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.causal import faithfulness, patch, trace_pairs
from rewardlens.causal._engine import sites
from rewardlens.model import Part
from rewardlens.zoo import DEMO_PAIRS
from tests.helpers.tiny import ARCHS

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_head_level_trace_gives_the_lens_and_both_attribution_levels(tiny_root, arch):
    model = rl.load(str(tiny_root[arch]))
    traced = trace_pairs(model, DEMO_PAIRS[:3], level="head", batch_size=4)
    dec = traced.decomposition
    sub = rl.attribute(model, DEMO_PAIRS[:3], batch_size=4)
    coarse = rl.Attribution.from_decomposition(dec.coarsen(), "sublayer")
    assert coarse.names == sub.names
    np.testing.assert_allclose(coarse.values, sub.values, **TOL)
    np.testing.assert_allclose(coarse.constant, sub.constant, **TOL)
    own = rl.lens(model, DEMO_PAIRS[:3], batch_size=4)
    view = rl.Lens.from_decomposition(dec)
    np.testing.assert_allclose(view.linear, own.linear, **TOL)
    np.testing.assert_allclose(view.normed, own.normed, **TOL)
    # the clean runs the patch engines read are those of the same trace
    np.testing.assert_allclose(traced.clean.reward.cpu().numpy(), dec.reward, **TOL)


def test_coarsen_sums_heads_and_bias_into_their_sublayer():
    from rewardlens.exact import Decomposition

    names = [Part.embed().name, Part.attn(0, 0).name, Part.attn(0, 1).name, Part.attn(0, bias=True).name,
             Part.mlp(0).name]
    values = np.arange(2 * 1 * 5, dtype=np.float32).reshape(2, 1, 5)
    dec = Decomposition(names=names, depth=np.array([0, 1, 1, 1, 1]), values=values,
                        head_constant=np.zeros((2, 1), np.float32), constants=np.zeros((2, 1, 2), np.float32),
                        objectives=values.sum(-1), coefficients=np.ones((2, 1), np.float32),
                        normed=np.zeros((2, 1, 2), np.float32), n_tokens=np.array([3, 3]), is_pairs=True,
                        labels=["reward"])
    coarse = dec.coarsen()
    assert coarse.names == ["embed", Part.attn(0).name, Part.mlp(0).name]
    np.testing.assert_array_equal(coarse.values[:, 0], [[0, 1 + 2 + 3, 4], [5, 6 + 7 + 8, 9]])
    assert coarse.depth.tolist() == [0, 1, 1]


def test_one_sweep_over_two_levels_equals_each_level_alone(tiny_root):
    model = rl.load(str(tiny_root["qwen2"]))
    pairs = DEMO_PAIRS[:3]
    fine, coarse = sites(model, "head"), sites(model, "sublayer")
    union = fine + [s for s in coarse if s not in set(fine)]
    both = patch(model, pairs, level="head", sweep=union)
    for level, own in (("head", patch(model, pairs, level="head")), ("sublayer", patch(model, pairs))):
        got = both.select(own.names, level)
        assert got.level == level and got.names == own.names
        np.testing.assert_allclose(got.effect, own.effect, **TOL)


def test_a_shared_clean_run_is_not_changed_by_the_sweeps_that_read_it(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    traced = trace_pairs(model, DEMO_PAIRS[:3], level="head")
    before = traced.clean.reward.clone()
    patch(model, DEMO_PAIRS[:3], level="head", clean=traced.clean)
    rl.causal.attribution_patch(model, DEMO_PAIRS[:3], level="head", clean=traced.clean)
    assert torch.equal(traced.clean.reward, before)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
def test_faithfulness_from_one_trace_equals_each_estimand_alone(tiny_root, arch):
    model = rl.load(str(tiny_root[arch]))
    pairs = DEMO_PAIRS[:4]
    rep = faithfulness(model, pairs, level="head", n_boot=50)
    att = rl.attribute(model, pairs, level="head")
    np.testing.assert_allclose(rep.attribution, att.margin[:, [att.names.index(n) for n in rep.names]], **TOL)
    np.testing.assert_allclose(rep.total, patch(model, pairs, level="head").effect, **TOL)
    np.testing.assert_allclose(rep.direct, patch(model, pairs, level="head", estimand="direct").effect, **TOL)
    np.testing.assert_allclose(rep.attribution_patching,
                               rl.causal.attribution_patch(model, pairs, level="head").effect, **TOL)
    seed = patch(model, pairs)  # the demo pairs are not token-aligned: read-position sublayer noising
    sub = rl.attribute(model, pairs)
    np.testing.assert_allclose(rep.seed_effect, seed.effect, **TOL)
    np.testing.assert_allclose(rep.seed_attribution, sub.margin[:, [sub.names.index(n) for n in seed.names]], **TOL)


def test_the_papers_statistic_is_prefix_noising_over_attention_and_mlp_sublayers(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    pairs = DEMO_PAIRS[:4]
    with pytest.warns(UserWarning):  # some demo pairs' read token lies past the shorter side
        rep = faithfulness(model, pairs, n_boot=50, paper=True)
        prefix = patch(model, pairs, positions="prefix")
    keep = [j for j, name in enumerate(prefix.names) if name != "embed"]
    assert len(keep) == 2 * model.n_layers
    np.testing.assert_allclose(rep.paper_effect, prefix.effect[:, keep], **TOL)
    sub = rl.attribute(model, pairs)
    att = sub.margin[:, [sub.names.index(prefix.names[j]) for j in keep]]
    np.testing.assert_allclose(rep.paper_attribution, att, **TOL)
    from scipy.stats import spearmanr

    expected = np.mean([spearmanr(np.abs(a), np.abs(e)).statistic for a, e in zip(att, prefix.effect[:, keep])])
    assert rep.paper_statistic()[0] == pytest.approx(expected, abs=1e-6)
    assert any("paper's way" in name for name in rep.summary().index)
    assert np.isnan(faithfulness(model, pairs, n_boot=20).paper_statistic()[0])  # not asked for: NaN, said so


def test_the_attribution_views_are_built_once_and_equal_the_instrument(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    traced = trace_pairs(model, DEMO_PAIRS[:3], level="head", batch_size=4)
    heads, sub = traced.attribution("head"), traced.attribution("sublayer")
    assert traced.attribution("head") is heads and traced.attribution("sublayer") is sub  # one build each
    own = rl.attribute(model, DEMO_PAIRS[:3], level="head", batch_size=4)
    assert heads.names == own.names and heads.level == "head" and sub.level == "sublayer"
    np.testing.assert_allclose(heads.values, own.values, **TOL)
    np.testing.assert_allclose(sub.values, rl.attribute(model, DEMO_PAIRS[:3], batch_size=4).values, **TOL)
    coarse = trace_pairs(model, DEMO_PAIRS[:3], level="sublayer", batch_size=4)
    with pytest.raises(ValueError, match="cannot give level='head'"):
        coarse.attribution("head")
