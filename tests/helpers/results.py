"""One instance of every result class with `to_frame`/`plot`, built on a tiny model (tests/test_plots.py's set),
for the tests that hold a rule every result follows: its plot, its notebook view (`_repr_html_`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

import rewardlens as rl

POLITE = {"polite": (["Thank you so much, friend.", "Thanks a lot, kindly."], ["Do it now.", "Go away now."])}


def snapshots() -> Any:
    """A three-step `Trajectory` of made-up snapshots (a monitor's result without a training run)."""
    from rewardlens.monitor import METRICS, Snapshot, Trajectory

    snap = lambda step: Snapshot(step, {m: 0.1 * step for m in METRICS}, np.arange(4.0) + step, ("embed",),
                                 np.array([0.5 * step]), ("length",), np.array([0.2 * step]))
    return Trajectory.from_snapshots([snap(s) for s in range(3)])


def policy_run() -> Any:
    """A three-step `PolicyRun` of made-up records."""
    from rewardlens.monitor import PolicyRecord, PolicyRun

    rec = lambda step: PolicyRecord(step, np.array([1.0, 2.0]) + step, ("length",), np.ones((2, 1)), np.zeros(2),
                                    np.ones(2), ("length",), np.ones((2, 1)), share=np.array([0.5, 0.3, 0.2]))
    return PolicyRun(tuple(rec(s) for s in range(3)))


def steps() -> Any:
    """Two sequences' reads of a made-up multi-read reward (`Steps`), with their parts."""
    from rewardlens.exact import Steps

    return Steps(np.array([0, 0, 1]), np.array([0, 1, 0]), np.array([3, 7, 5]), np.array([0.5, 0.5, 1.0]),
                 np.array([0.2, -0.4, 1.1]), np.array([0.1, 0.1, 0.1]), np.array([[0.3, -0.2], [0.1, -0.6],
                                                                                  [0.4, 0.6]]), ["embed", "attn_L0"])


def every_result(model: Any, pairs: list[Any], sycophancy: Any, loop: Any = None) -> dict[str, Any]:
    """{class name: one result of that class}: `model` a tiny RM, `pairs` its pairs, `sycophancy` the
    sycophancy organism (a loaded RM; probes need real signal), `loop` a `ClosedLoop` (left out when None)."""
    from rewardlens.bench import bench
    from rewardlens.calibrate import Grade, Scorecard
    from rewardlens.compare import compare
    from rewardlens.hacking import edit_report
    from rewardlens.model import parity
    from rewardlens.sae import TrainResult, feature_report

    sae = rl.sae.TopKSAE(model.d_model, rl.sae.SAEConfig(expansion_factor=2, k=4), seed=0)
    features = rl.attribute_features(model, sae, pairs, layer=0)
    probes = rl.probe(sycophancy, axes=["length", "hedging", "emoji"], n_boot=100)
    edited = rl.edit(model, *POLITE["polite"])
    subset_pairs = [replace(p, subset=s) for p, s in zip(pairs, ["alpacaeval-easy", "refusals-dangerous"] * len(pairs))]
    benched = bench(model, subset_pairs, against=model, n_boot=40)
    report = feature_report(model, sae, features, [p.chosen for p in pairs], top=3, n_contexts=2, window=3)
    top = [int(f) for f, _ in features.top(3, by="margin")]
    out = {
        "Lens": rl.lens(model, pairs),
        "Attribution": rl.attribute(model, pairs, level="head"),
        "TokenAttribution": rl.tokens(model, pairs),
        "Patching": rl.patch(model, pairs),
        "Faithfulness": rl.faithfulness(model, pairs, n_boot=50),
        "Concepts": rl.concepts(model, POLITE, n_boot=50),
        "Conflicts": rl.hacking.conflict(model, pairs, terms={"a": pairs[:2], "b": pairs[1:]}, n_boot=100),
        "EditReport": edit_report(model, edited, probe_pairs=pairs[:2], other_pairs=pairs[2:]),
        "Edit": edited,
        "Probes": probes,
        "Distortion": rl.hacking.distortion(probes, n_boot=50),
        "Cascades": rl.hacking.cascade(probes, n_boot=50),
        "FeatureAttribution": features,
        "FeatureReport": report,
        "TrainResult": TrainResult(sae, np.array([0.9, 0.5, 0.3]), np.zeros(3), np.array([0.5, 0.2, 0.1]), 30, 1.0),
        "Comparison": compare(model, model, pairs, n_boot=50),
        "Trajectory": snapshots(),
        "PolicyRun": policy_run(),
        "Bench": benched,
        "BenchComparison": benched.comparison,
        "PathPatching": rl.path_patch(model, pairs, senders=["embed", "attn_L0", "mlp_L0"],
                                      receivers=["attn_L1", "reward"]),
        "Circuit": rl.circuit(model, pairs, top=3),
        "Edges": rl.edges(model, pairs),
        "Steps": steps(),
        "Scorecard": Scorecard((Grade.of("lens", "circuit", "crystallizes at the planted layer", 1.0, 1.0),
                                Grade.of("patching", "circuit", "planted head ranked first", 0.4, 0.8)),
                               {"n_boot": 50}),
        "Parity": parity(model, pairs),
        "FeaturePatch": rl.feature_patch(model, sae, pairs, layer=0, features=top, n_boot=50),
        "FeatureSteer": rl.sae.feature_steer(model, sae, pairs, layer=0, feature=top[0], doses=(-1, 0, 1), n_boot=50),
        "FeatureCards": report.cards,
    }
    if loop is not None:
        out["ClosedLoop"] = loop
    return {k: v for k, v in out.items() if v is not None}
