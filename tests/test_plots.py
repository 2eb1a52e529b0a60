"""Every result's `.plot()` draws (on the Agg canvas) what the result holds, into a new figure or into the
axes it is given (`plot(ax=...)`, the rule in `rewardlens.plotting`)."""

import ast
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

import rewardlens as rl
from rewardlens.audit._graph import audit_graphs
from rewardlens.bench import bench
from rewardlens.hacking import edit_report
from rewardlens.monitor import METRICS, PolicyRecord, PolicyRun, Snapshot, Trajectory
from rewardlens.sae import TrainResult, feature_report

POLITE = {"polite": (["Thank you so much, friend.", "Thanks a lot, kindly."], ["Do it now.", "Go away now."])}


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
    cv = rl.concepts(model, POLITE, n_boot=50)
    right = _drawn(cv.plot()).axes[1].get_lines()[0]
    np.testing.assert_allclose(right.get_ydata(), np.nanmean(cv.dose[0], axis=1))
    cf = rl.hacking.conflict(model, pairs, terms={"a": pairs[:2], "b": pairs[1:]}, n_boot=100)
    image = _drawn(cf.plot()).axes[0].images[0].get_array()
    np.testing.assert_allclose(np.ma.filled(image, np.nan), cf.cosine, equal_nan=True)  # NaN cells are masked
    sae = rl.sae.TopKSAE(model.d_model, rl.sae.SAEConfig(expansion_factor=2, k=4), seed=0)
    fa = rl.attribute_features(model, sae, pairs, layer=0)
    bars = _drawn(fa.plot(n=3)).axes[0].patches
    np.testing.assert_allclose(sorted(b.get_width() for b in bars), sorted(v for _, v in fa.top(3, by="margin")))


def test_probe_forest_plot_draws_every_axis(organisms):
    pr = rl.probe(rl.load(str(organisms[("sycophancy", 1.0)])), axes=["length", "hedging", "emoji"], n_boot=100)
    ax = _drawn(pr.plot()).axes[0]
    np.testing.assert_allclose(sorted(ax.collections[-1].get_offsets()[:, 0]), sorted(pr.mean))


# ---- plot(ax=...): every result draws into the axes it is given ----------------------------------------

def _classes_with_plot() -> set[str]:
    """Every class in the package's source that defines a `plot` method (read with `ast`, so a new
    result cannot be left out of the test below)."""
    root = Path(rl.__file__).parent
    return {node.name for path in root.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)
            and any(isinstance(f, ast.FunctionDef) and f.name == "plot" for f in node.body)}


def _snapshots() -> Trajectory:
    snap = lambda step: Snapshot(step, {m: 0.1 * step for m in METRICS}, np.arange(4.0) + step, ("embed",),
                                 np.array([0.5 * step]), ("length",), np.array([0.2 * step]))
    return Trajectory.from_snapshots([snap(s) for s in range(3)])


def _policy_run() -> PolicyRun:
    rec = lambda step: PolicyRecord(step, np.array([1.0, 2.0]) + step, ("length",), np.ones((2, 1)), np.zeros(2),
                                    np.ones(2), ("length",), np.ones((2, 1)), share=np.array([0.5, 0.3, 0.2]))
    return PolicyRun(tuple(rec(s) for s in range(3)))


@pytest.fixture(scope="module")
def results(model, pairs, organisms, small_loop):
    """{class name: (a result of that class, its panels as (rows, cols), plot keywords)}."""
    sae = rl.sae.TopKSAE(model.d_model, rl.sae.SAEConfig(expansion_factor=2, k=4), seed=0)
    features = rl.attribute_features(model, sae, pairs, layer=0)
    probes = rl.probe(rl.load(str(organisms[("sycophancy", 1.0)])), axes=["length", "hedging", "emoji"], n_boot=100)
    edited = rl.edit(model, *POLITE["polite"])
    subset_pairs = [replace(p, subset=s) for p, s in zip(pairs, ["alpacaeval-easy", "refusals-dangerous"] * len(pairs))]
    benched = bench(model, subset_pairs, against=model, n_boot=40)
    assert benched.comparison is not None
    report = feature_report(model, sae, features, [p.chosen for p in pairs], top=3, n_contexts=2, window=3)
    top = [int(f) for f, _ in features.top(3, by="margin")]
    return {
        "Lens": (rl.lens(model, pairs), (1, 1), {}),
        "Attribution": (rl.attribute(model, pairs, level="head"), (1, 1), {"n": 5}),
        "TokenAttribution": (rl.tokens(model, pairs), (1, 1), {"row": 0}),
        "Patching": (rl.patch(model, pairs), (1, 1), {"n": 4}),
        "Faithfulness": (rl.faithfulness(model, pairs, n_boot=50), (1, 2), {}),
        "Concepts": (rl.concepts(model, POLITE, n_boot=50), (1, 2), {}),
        "Conflicts": (rl.hacking.conflict(model, pairs, terms={"a": pairs[:2], "b": pairs[1:]}, n_boot=100), (1, 2),
                      {}),
        "EditReport": (edit_report(model, edited, probe_pairs=pairs[:2], other_pairs=pairs[2:]), (1, 1), {}),
        "Probes": (probes, (1, 1), {}),
        "Distortion": (rl.hacking.distortion(probes, n_boot=50), (1, 1), {"quality": probes.quality[0]}),
        "Cascades": (rl.hacking.cascade(probes, n_boot=50), (1, 1), {}),
        "FeatureAttribution": (features, (1, 1), {"n": 3}),
        "FeatureReport": (report, (1, 1), {}),
        "TrainResult": (TrainResult(sae, np.array([0.9, 0.5, 0.3]), np.zeros(3), np.array([0.5, 0.2, 0.1]), 30, 1.0),
                        (1, 1), {}),
        "Comparison": (rl.compare(model, model, pairs, n_boot=50), (2, 2), {}),
        "Trajectory": (_snapshots(), (1, 4), {}),
        "PolicyRun": (_policy_run(), (1, 2), {}),
        "Bench": (benched, (1, 2), {}),
        "BenchComparison": (benched.comparison, (1, 1), {}),
        "PathPatching": (rl.path_patch(model, pairs, senders=["embed", "attn_L0", "mlp_L0"],
                                       receivers=["attn_L1", "reward"]), (1, 1), {"n": 4}),
        "Circuit": (rl.circuit(model, pairs, top=3), (1, 1), {}),
        "FeaturePatch": (rl.feature_patch(model, sae, pairs, layer=0, features=top, n_boot=50), (1, 1), {"n": 3}),
        "FeatureSteer": (rl.sae.feature_steer(model, sae, pairs, layer=0, feature=top[0], doses=(-1, 0, 1), n_boot=50),
                         (1, 1), {}),
        "FeatureCards": (report.cards, (1, 1), {}),
        "ClosedLoop": (small_loop, (1, 1), {}),
        "AttributionGraph": (rl.graph(model, pairs[:1], basis="neurons", max_nodes=32)[0].margin, (1, 1), {}),
        "AuditGraphs": (audit_graphs(model, pairs, [0], None, 4), (1, 1), {}),
    }


def test_every_class_with_a_plot_is_tested(results):
    assert _classes_with_plot() == set(results)


@pytest.mark.parametrize("name", sorted(_classes_with_plot()))
def test_every_plot_draws_into_the_axes_it_is_given(results, name):
    result, (rows, cols), kwargs = results[name]
    fig = Figure(layout="constrained")  # outside pyplot, as the audit report draws
    grid = fig.subplots(rows, cols, squeeze=False)
    given = grid[0, 0] if rows * cols == 1 else grid
    open_before = plt.get_fignums()
    assert result.plot(**kwargs, ax=given) is fig
    assert plt.get_fignums() == open_before  # no figure of its own was made
    assert fig.get_layout_engine().__class__.__name__ == "ConstrainedLayoutEngine"  # the caller's layout is kept
    for ax in grid.ravel():
        assert ax.has_data() or ax.texts, f"{name}.plot drew nothing into one of the {rows * cols} axes it was given"
    fig.canvas.draw()
    own = _drawn(result.plot(**kwargs))  # without ax: a new pyplot figure of the same panels (and colour bars)
    assert isinstance(own, Figure) and len(own.axes) >= rows * cols


def test_plots_of_several_panels_want_that_many_axes(results):
    fa = results["Faithfulness"][0]
    with pytest.raises(TypeError, match="2 panels"):
        fa.plot(ax=plt.subplots()[1])
    with pytest.raises(ValueError, match="2 panels"):
        fa.plot(ax=plt.subplots(1, 3)[1])
    plt.close("all")


def test_plot_into_given_axes_holds_the_same_numbers(results):
    """Drawn into a subfigure's axes: the values are the result's, and the root figure comes back."""
    fig = Figure()
    left, right = fig.subfigures(1, 2)
    ln = results["Lens"][0]
    assert ln.plot(ax=left.subplots()) is fig
    for line, kind in zip(left.axes[0].get_lines(), ("linear", "normed")):
        np.testing.assert_allclose(line.get_ydata(), ln.margin(kind).mean(0))
    att = results["Attribution"][0]
    att.plot(n=5, ax=right.subplots())
    bars = right.axes[0].patches
    np.testing.assert_allclose(sorted(b.get_width() for b in bars), sorted(v for _, v in att.top(5, by="margin")))
