"""Every summary computes what its label says (issue 20): crafted inputs where the statistics disagree."""

from __future__ import annotations

import numpy as np

from rewardlens.cli.causal import rank_parts


def _crafted() -> tuple[list[str], np.ndarray, np.ndarray]:
    # 'flip' changes sign between pairs: the largest mean |effect|, a zero mean effect.
    # pair 2's margin is tiny: a per-pair ratio blows up there, the ratio of means does not.
    names = ["flip", "steady", "small"]
    effect = np.array([[+4.0, 1.0, 0.2], [-4.0, 1.2, 0.1], [+4.0, 0.9, 0.01], [-4.0, 1.1, 0.3]])
    margin = np.array([2.0, 2.5, 0.015, 3.0])
    return names, effect, margin


def test_patch_ranks_by_mean_abs_effect_and_shows_the_signed_mean():
    names, effect, margin = _crafted()
    out = rank_parts(names, effect, margin, 3)
    mean_abs, mean = np.abs(effect).mean(0), effect.mean(0)
    assert np.argsort(-np.abs(mean))[0] != 0  # the two rankings disagree on this input
    assert [t["part"] for t in out["top_parts"]] == [names[i] for i in np.argsort(-mean_abs)]
    for t in out["top_parts"]:
        i = names.index(t["part"])
        assert t["mean_abs_effect"] == np.float64(mean_abs[i]) and t["mean_effect"] == np.float64(mean[i])
    assert out["top_parts"][0]["part"] == "flip" and abs(out["top_parts"][0]["mean_effect"]) < 1e-12


def test_share_of_margin_is_a_ratio_of_means():
    names, effect, margin = _crafted()
    out = rank_parts(names, effect, margin, 3)
    ratio_of_means = effect.mean(0) / margin.mean()
    mean_of_ratios = (effect / margin[:, None]).mean(0)
    i = names.index("steady")
    assert abs(mean_of_ratios[i] - ratio_of_means[i]) > 1  # the two statistics disagree here
    got = {t["part"]: t["share_of_mean_margin"] for t in out["top_parts"]}
    np.testing.assert_allclose([got[n] for n in names], ratio_of_means)
    assert out["mean_margin"] == np.float64(margin.mean()) and out["share_note"] is None


def test_undefined_shares_say_why_and_no_pairs_is_empty():
    names, effect, _ = _crafted()
    out = rank_parts(names, effect, np.array([1.0, -1.0, 1e-5, -1e-5]), 2)
    assert all(t["share_of_mean_margin"] is None for t in out["top_parts"]) and "undefined" in out["share_note"]
    empty = rank_parts(names, np.zeros((0, 3)), np.zeros(0), 2)
    assert empty["top_parts"] == [] and empty["mean_margin"] is None and empty["share_note"]
    nan = rank_parts(names, np.array([[np.nan, 1.0, 2.0]]), np.array([1.0]), 3)
    assert [t["part"] for t in nan["top_parts"]] == ["small", "steady", "flip"]  # NaN last, not first
    assert nan["top_parts"][2]["mean_abs_effect"] is None
