"""The seed paper's coverage-form distortion index, beside ours, against a hand computation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.hacking import Probes, distortion, probe


@pytest.fixture(scope="module")
def probes(tiny_root, pairs) -> Probes:
    model = rl.load(str(tiny_root["llama"]))
    return probe(model, pairs, axes=["emoji", "formatting"], quality=False, n_boot=50)


def _with_quality(probes: Probes, columns: list[list[float]]) -> Probes:
    """`probes` with hand-written quality drops on the first items (NaN: a degradation that did not apply)."""
    quality = np.full((probes.delta.shape[0], len(columns)), np.nan)
    for k, column in enumerate(columns):
        quality[: len(column), k] = column
    return dataclasses.replace(probes, quality=("correctness", "evasion", "relevance")[: len(columns)],
                               quality_delta=quality)


def test_coverage_form_against_a_hand_computation(probes: Probes) -> None:
    assert probes.delta.shape[0] >= 3
    d = distortion(_with_quality(probes, [[2, 0, np.nan], [4, 1], [3, 3]]), n_boot=50)
    # Pooled over every dimension: min 0, max 4, so c = (Q − 0) / 4:
    #   correctness c = 1/2, 0     C_eff = 1 − (1/2)(1)      = 1/2
    #   evasion     c = 1, 1/4     C_eff = 1 − (0)(3/4)      = 1
    #   relevance   c = 3/4, 3/4   C_eff = 1 − (1/4)(1/4)    = 15/16
    np.testing.assert_allclose(d.coverage, [0.5, 1.0, 15 / 16])
    np.testing.assert_allclose(d.coverage_index, [0.5, 0.0, 1 / 16])  # 1 − C_eff / max C_eff, max = 1
    frame = d.to_frame()
    np.testing.assert_allclose(frame.loc[frame["quality"] == "relevance", "coverage_index"], 1 / 16)
    # Ours is per axis and in quality units; the coverage form has no axis in it.
    assert d.index.shape == (2, 3) and d.coverage_index.shape == (3,)


def test_equal_samples_and_a_dimension_without_any(probes: Probes) -> None:
    # All samples equal: each c = 1/2, so C_eff = 1 − (1/2)^n grows with the number of samples alone.
    d = distortion(_with_quality(probes, [[1, 1, 1], [1]]), n_boot=50)
    np.testing.assert_allclose(d.coverage, [7 / 8, 1 / 2])
    np.testing.assert_allclose(d.coverage_index, [0, 1 - (1 / 2) / (7 / 8)])
    # A dimension no degradation applied to has no coverage: index 1 (the seed code's "0 probes").
    empty = distortion(_with_quality(probes, [[2, 1], []]), n_boot=50)
    np.testing.assert_allclose(empty.coverage, [1, 0])  # c = 1, 0: C_eff = 1 − (0)(1); no sample: 1 − 1
    np.testing.assert_allclose(empty.coverage_index, [0, 1])
