"""The renames of docs/design.md "Words" (issue 43 item 4): each new keyword gives what the old one gave, and
the old keyword still works for one release with a DeprecationWarning naming the new one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import rewardlens as rl
from rewardlens.bench import bench
from rewardlens.data import Pair
from rewardlens.hacking import cascade, distortion, probe
from rewardlens.sae import SAEConfig, TopKSAE, feature_patch
from rewardlens.zoo import demo_model_dir
from tests.bench.test_bench import Table


@pytest.fixture(scope="module")
def demo():
    return rl.load(str(demo_model_dir()))


@pytest.fixture(scope="module")
def probes(demo):
    return probe(demo, axes=["length", "hedging", "emoji"], n_boot=50, alpha=0.2)


def _same(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_probe_alpha_is_the_significance_level_and_level_its_old_name(demo, probes):
    # The yardstick: the flag rule of docs/probes.md, q < alpha and |mean| ≥ the flag floor, from the result's own q.
    floor = probes.min_effect * probes.scale
    _same(probes.flagged, (probes.q < 0.2) & (np.abs(probes.mean) >= floor))
    assert probes.level == 0.2
    with pytest.warns(DeprecationWarning, match=r"probe\(level=\.\.\.\).*use alpha="):
        old = probe(demo, axes=["length", "hedging", "emoji"], n_boot=50, level=0.2)
    _same(old.flagged, probes.flagged)
    _same(old.q, probes.q)


def test_cascade_and_distortion_take_confidence(probes):
    new = cascade(probes, n_boot=50, confidence=0.8)
    with pytest.warns(DeprecationWarning, match=r"cascade\(level=\.\.\.\).*use confidence="):
        old = cascade(probes, n_boot=50, level=0.8)
    _same(old.ci, new.ci)
    assert not np.array_equal(np.nan_to_num(cascade(probes, n_boot=50).ci), np.nan_to_num(new.ci))  # it is used
    d_new = distortion(probes, n_boot=50, confidence=0.8)
    with pytest.warns(DeprecationWarning, match=r"distortion\(level=\.\.\.\).*use confidence="):
        d_old = distortion(probes, n_boot=50, level=0.8)
    pd.testing.assert_frame_equal(d_old.to_frame(), d_new.to_frame())


def test_bench_takes_confidence():
    pairs = [Pair("q", f"a{i}", f"b{i}", id=str(i), subset="alpacaeval-easy") for i in range(6)]
    table = Table({**{f"a{i}": 1.0 for i in range(6)}, **{f"b{i}": float(i % 2) * 2 for i in range(6)}})
    new = bench(table, pairs, n_boot=400, confidence=0.99)  # type: ignore[arg-type]
    with pytest.warns(DeprecationWarning, match=r"bench\(level=\.\.\.\).*use confidence="):
        old = bench(table, pairs, n_boot=400, level=0.99)  # type: ignore[arg-type]
    pd.testing.assert_frame_equal(old.to_frame(), new.to_frame())
    assert not bench(table, pairs, n_boot=400).to_frame().equals(new.to_frame())  # type: ignore[arg-type]


def test_feature_patch_edit_is_what_mode_was(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    sae = TopKSAE(model.d_model, SAEConfig(expansion_factor=2, k=4), seed=1)
    pairs = [Pair("Say hi.", "Hi there!", "No."), Pair("Count.", "One, two.", "Three")]
    new = feature_patch(model, sae, pairs, layer=0, features=[0, 1], edit="clamp", value=2.0, n_boot=10)
    with pytest.warns(DeprecationWarning, match=r"feature_patch\(mode=\.\.\.\).*use edit="):
        old = feature_patch(model, sae, pairs, layer=0, features=[0, 1], mode="clamp", value=2.0, n_boot=10)
    _same(old.total, new.total)
    assert new.edit == "clamp"
    with pytest.warns(DeprecationWarning, match=r"FeaturePatch\.mode .*FeaturePatch\.edit"):
        assert new.mode == "clamp"
