"""Every result's `.plot()` draws (on the Agg canvas) what the result holds."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

import rewardlens as rl


@pytest.fixture(scope="module")
def model(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def _drawn(fig):
    fig.canvas.draw()  # errors in artists (colours, shapes) surface only when drawn
    plt.close(fig)
    return fig


def test_lens_plot_draws_both_mean_margin_curves(model, pairs):
    ln = rl.lens(model, pairs)
    lines = _drawn(ln.plot()).axes[0].get_lines()
    for line, kind in zip(lines, ("linear", "normed")):
        np.testing.assert_allclose(line.get_ydata(), ln.margin(kind).mean(0))


def test_attribution_and_patching_bars_are_their_top_parts(model, pairs):
    att = rl.attribute(model, pairs, level="head")
    bars = _drawn(att.plot(n=5)).axes[0].patches
    np.testing.assert_allclose(sorted(b.get_width() for b in bars), sorted(v for _, v in att.top(5, by="margin")))
    pt = rl.patch(model, pairs)
    bars = _drawn(pt.plot(n=4)).axes[0].patches
    np.testing.assert_allclose(sorted(b.get_width() for b in bars), sorted(v for _, v in pt.top(4)))


def test_faithfulness_scatter_holds_attribution_against_each_effect(model, pairs):
    fa = rl.faithfulness(model, pairs, n_boot=200)
    fig = _drawn(fa.plot())
    for ax, name in zip(fig.axes, ("direct", "total")):
        xy = ax.collections[0].get_offsets()
        np.testing.assert_allclose(xy[:, 0], fa.attribution.ravel())
        np.testing.assert_allclose(xy[:, 1], getattr(fa, name).ravel())


def test_concept_conflict_and_feature_plots_draw(model, pairs):
    sets = {"polite": (["Thank you so much, friend.", "Thanks a lot, kindly."], ["Do it now.", "Go away now."])}
    cv = rl.concepts(model, sets, n_boot=50)
    right = _drawn(cv.plot()).axes[1].get_lines()[0]
    np.testing.assert_allclose(right.get_ydata(), np.nanmean(cv.dose[0], axis=1))
    cf = rl.conflict(model, pairs, terms={"a": pairs[:2], "b": pairs[1:]}, n_boot=100)
    image = _drawn(cf.plot()).axes[0].images[0].get_array()
    np.testing.assert_allclose(image, cf.cosine)
    sae = rl.TopKSAE(model.d_model, rl.SAEConfig(expansion_factor=2, k=4), seed=0)
    fa = rl.attribute_features(model, sae, pairs, layer=0)
    bars = _drawn(fa.plot(n=3)).axes[0].patches
    np.testing.assert_allclose(sorted(b.get_width() for b in bars), sorted(v for _, v in fa.top(3, by="margin")))


def test_probe_forest_plot_draws_every_axis(organisms):
    pr = rl.probe(rl.load(str(organisms[("sycophancy", 1.0)])), axes=["length", "hedging", "emoji"], n_boot=100)
    ax = _drawn(pr.plot()).axes[0]
    np.testing.assert_allclose(sorted(ax.collections[-1].get_offsets()[:, 0]), sorted(pr.mean))
