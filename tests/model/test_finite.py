"""Finiteness of results (`rewardlens.model.internal.score_pairs`): NaN pairs are named and left out of the
accuracy (never counted as losses), no finite pair is an error naming the cause, and a model whose
margins are all exactly 0 (a down-projection overflowing) says so."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.data import margin
from rewardlens.errors import NonFiniteError, RewardLensWarning
from rewardlens.model.internal import SATURATED, finite_pairs, pair_accuracy, score_pairs
from rewardlens.stats import wilson
from tests.helpers import finite


@pytest.fixture(scope="module")
def nan_model(tiny_root, tokenizer, tmp_path_factory):
    return rl.load(str(finite.nan_word_model(tiny_root["llama"], tmp_path_factory.mktemp("injected") / "m", tokenizer)))


def test_nan_pairs_are_named_and_not_counted_as_losses(nan_model):
    pairs = finite.pairs(6, bad={3, 5})
    reward = nan_model.score(pairs)
    assert np.isnan(reward[[4, 5, 8, 9]]).all() and np.isfinite(np.delete(reward, [4, 5, 8, 9])).all()
    kept, acc = score_pairs(reward, [p.id for p in pairs])
    m = margin(reward)
    good = [i for i in range(6) if i not in (2, 4)]
    wins = int(np.sum(m[good] > 0))
    assert kept.excluded == ("p3", "p5") and kept.finite.tolist() == [True, True, False, True, False, True]
    assert (acc.n, acc.total, acc.correct) == (4, 6, wins) and acc.accuracy == pytest.approx(wins / 4)
    assert acc.ci == pytest.approx(wilson(wins, 4))
    assert acc.line() == (f"pair accuracy: {wins / 4:.3f} over 4 of 6 pairs; "
                          "2 pairs with non-finite rewards excluded: p3, p5")


def test_a_non_finite_part_excludes_its_pair_and_subsets_do_not_raise():
    reward = np.array([1.0, 0.0, 2.0, 3.0, 1.0, -1.0])
    parts = np.ones((6, 2))
    parts[3, 1] = np.inf  # pair 1's rejected side: one part overflows, its reward is finite
    kept = finite_pairs(reward, ["a", "b", "c"], parts=[parts])
    assert kept.excluded == ("b",)
    only_b = pair_accuracy(margin(reward)[[1]], kept.take(np.array([False, True, False])))
    assert only_b.n == 0 and np.isnan(only_b.accuracy) and only_b.excluded == ("b",)


def test_no_finite_pair_is_an_error_naming_the_cause(tiny_root):
    model = finite.overflowing(rl.load(str(tiny_root["llama"])), float("nan"))
    pairs = finite.pairs(3, bad=set())
    with pytest.raises(NonFiniteError, match=r"every reward is NaN: a weight of the model is non-finite or "
                                             r"overflows in float32; check the weights"):
        score_pairs(model.score(pairs), [p.id for p in pairs], dtype=rl.model.internal.dtype_name(model))
    with pytest.raises(NonFiniteError, match=r"overflows in bfloat16; check the weights, or load the model in "
                                             r"float32 \(dtype='float32'\)"):
        score_pairs(np.full(4, np.inf), ["a", "b"], dtype="bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_margin_exactly_zero_is_named(tiny_root, dtype):
    model = finite.overflowing(rl.load(str(tiny_root["llama"]), dtype=dtype))  # x² overflows: reward = constant
    pairs = finite.pairs(3, bad=set())
    reward = model.score(pairs)
    assert np.isfinite(reward).all() and np.all(margin(reward) == 0)
    with pytest.warns(RewardLensWarning, match="every margin is exactly 0: the model saturates"):
        _, acc = score_pairs(reward, [p.id for p in pairs])
    assert acc.saturated and acc.notes == (SATURATED,)
    assert acc.line() == f"pair accuracy: 0.000 over 3 pairs; {SATURATED}"


def test_one_tie_is_not_saturation():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning
        _, acc = score_pairs(np.array([1.0, 1.0]), ["a"])
    assert not acc.saturated and acc.ties == 1 and acc.notes == ()


def test_instruments_without_pair_ids_leave_non_finite_margins_out_too(nan_model):
    """compare, the training monitor and an edit's report counted a NaN margin as a loss (`NaN > 0` is False)."""
    from rewardlens.compare import compare
    from rewardlens.hacking import EditReport
    from rewardlens.model.internal import finite_accuracy
    from rewardlens.monitor import measure

    pairs = finite.pairs(6, bad={3, 5})
    pairs = [rl.Pair(p.prompt, p.rejected, p.chosen, id=p.id) if i < 2 else p for i, p in enumerate(pairs)]
    m = margin(nan_model.score(pairs))
    good = m[[0, 1, 3, 5]]
    wins = float(np.mean(good > 0))
    assert 0 < wins < 1  # else counting NaN as a loss would give the same share
    assert finite_accuracy(m) == pytest.approx(wins) and np.isnan(finite_accuracy(np.full(3, np.nan)))
    snap = measure(nan_model, pairs, step=0)
    assert snap.metrics["accuracy"] == pytest.approx(wins) and snap.metrics["margin"] == pytest.approx(good.mean())
    res = compare(nan_model, nan_model, pairs, probes=False, n_boot=50)
    assert res.a.accuracy == pytest.approx(wins) and np.isfinite(res.accuracy_ci).all()
    report = EditReport([], np.zeros(0), np.zeros(0), [p.id for p in pairs], m, m)
    assert report.accuracy_before == pytest.approx(wins) and report.accuracy_change == 0.0
