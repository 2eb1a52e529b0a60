"""`Distortion.ranking` answers the asked quality dimension, with the reason when it is undefined."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.errors import RewardLensWarning
from rewardlens.hacking import Distortion, Probes, distortion, probe


@pytest.fixture(scope="module")
def probes(tiny_root, pairs) -> Probes:
    model = rl.load(str(tiny_root["llama"]))
    res = probe(model, pairs, axes=["emoji", "formatting"], quality=False, n_boot=200)
    n = res.delta.shape[0]
    rng = np.random.default_rng(0)
    # correctness: the model does not reward it (drops around 0); evasion: a clear, positive drop
    quality = np.stack([rng.normal(0.0, 1.0, n) - 0.5, rng.normal(1.0, 0.05, n)], 1)
    return dataclasses.replace(res, quality=("correctness", "evasion"), quality_delta=quality)


@pytest.fixture(scope="module")
def dist(probes: Probes) -> Distortion:
    d = distortion(probes, n_boot=200)
    assert d.note[0] and not d.note[1]  # the crafted case: correctness undefined, evasion defined
    return d


def test_an_undefined_dimension_is_answered_with_its_reason_never_another(dist: Distortion) -> None:
    with pytest.warns(RewardLensWarning, match="distortion vs correctness is undefined") as record:
        ranking = dist.ranking("correctness")
    message = str(record[0].message)
    assert "does not reliably reward correctness" in message and "defined dimensions: evasion" in message
    assert [a for a, _ in ranking] == list(dist.axes) and all(np.isnan(v) for _, v in ranking)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RewardLensWarning)
        defined = dist.ranking("evasion")
    values = [v for _, v in defined]
    assert np.isfinite(values[0]) and values == sorted(values, key=lambda v: -np.inf if np.isnan(v) else v,
                                                       reverse=True)


def test_no_default_dimension_when_there_are_several(dist: Distortion) -> None:
    with pytest.raises(ValueError, match=r"correctness \(undefined\), evasion \(defined\)"):
        dist.ranking()
    with pytest.raises(KeyError, match="have"):
        dist.ranking("fluency")
    one = dataclasses.replace(dist, quality=("evasion",), index=dist.index[:, 1:], ci=dist.ci[:, 1:],
                              quality_effect=dist.quality_effect[1:], quality_ci=dist.quality_ci[1:],
                              flagged=dist.flagged[:, 1:], note=dist.note[1:])
    assert str(one.ranking()) == str(dist.ranking("evasion"))  # str: NaN == NaN


def test_the_frame_carries_the_reason(dist: Distortion) -> None:
    frame = dist.to_frame()
    undefined = frame[frame["quality"] == "correctness"]
    assert undefined["index"].isna().all() and undefined["note"].str.contains("does not reliably reward").all()
    assert (frame.loc[frame["quality"] == "evasion", "note"] == "").all()


def test_the_ranking_the_user_holds_carries_the_reason(dist: Distortion) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardLensWarning)  # a notebook that filtered the warning still has the reason
        undefined = dist.ranking("correctness")
    assert undefined.quality == "correctness" and "does not reliably reward correctness" in undefined.note
    assert "defined dimensions: evasion" in undefined.note and all(np.isnan(v) for _, v in undefined)
    defined = dist.ranking("evasion")
    assert defined.note == "" and defined.quality == "evasion"
    assert isinstance(defined, list) and list(defined) == [tuple(r) for r in defined]  # still a list of (axis, index)
