"""The flag floor's one scale (hacking/_scale.py): the sd of the base items' rewards, the reference pairs'
mean |margin| only as the named alternative, and a flag that differs between the two marked fragile, with
the reason naming both scales. Yardsticks: numpy's sd of the rewards the model itself gives, the margins of
`model.score`, and the flag rule re-applied by hand under each scale."""

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.calibrate import bank_items
from rewardlens.hacking import probe
from rewardlens.zoo.organisms import ORGANISMS

AXES = ["formatting", "length", "emoji", "politeness", "refusal"]


@pytest.fixture(scope="module")
def list_model(organisms):
    return rl.load(str(organisms[("list", 1.0)]))


@pytest.fixture(scope="module")
def reference():
    return ORGANISMS["list"].pairs(30, seed=1)


@pytest.fixture(scope="module")
def by_items(list_model, reference):
    return probe(list_model, bank_items(24), axes=AXES, reference=reference, n_boot=300)


def _flags(res, scale):
    """The flag rule by hand: q < level and |mean| >= min_effect × scale."""
    return np.array([q < res.level and abs(m) >= res.min_effect * scale for m, q in zip(res.mean, res.q)])


def test_the_floor_is_the_items_reward_sd_and_the_pairs_mean_margin_the_alternative(list_model, reference, by_items):
    res = by_items
    assert res.scale == pytest.approx(float(np.std(res.base_reward, ddof=1)), rel=1e-12)
    assert res.scale_source == "sd of the rewards of 24 base items"
    reward = list_model.score(reference)
    assert res.alt_scale == pytest.approx(float(np.mean(np.abs(reward[0::2] - reward[1::2]))), rel=1e-5)
    assert res.alt_scale_source == "mean |margin| of 30 reference pairs"
    np.testing.assert_array_equal(res.flagged, _flags(res, res.scale))
    np.testing.assert_array_equal(res.fragile, _flags(res, res.scale) != _flags(res, res.alt_scale))
    for axis, fragile, why in zip(res.axes, res.fragile, res.fragile_reason):
        assert bool(why) == bool(fragile), axis
    # the named alternative: the same statistics, the floor from the pairs, checked against the items' sd
    swapped = probe(list_model, bank_items(24), axes=AXES, reference=reference, scale="reference", n_boot=300)
    assert swapped.scale == pytest.approx(res.alt_scale) and swapped.alt_scale == pytest.approx(res.scale)
    np.testing.assert_array_equal(swapped.flagged, _flags(res, res.alt_scale))
    np.testing.assert_array_equal(swapped.fragile, res.fragile)
    # no reference: the same floor, and nothing to be fragile against
    alone = probe(list_model, bank_items(24), axes=AXES, n_boot=300)
    assert alone.scale == res.scale and np.isnan(alone.alt_scale) and not alone.fragile.any()
    np.testing.assert_array_equal(alone.flagged, res.flagged)


@pytest.mark.parametrize("alt", [1e6, 1e-9])
def test_a_flag_that_the_other_scale_changes_is_fragile_and_says_both_scales(list_model, by_items, alt):
    """An alternative scale so large that it flags nothing, or so small that every significant axis passes its
    floor: the fragile axes are exactly those whose flag the rule by hand changes, and the reason names both."""
    res = probe(list_model, bank_items(24), axes=AXES, reference=alt, n_boot=300)
    under = _flags(res, alt)
    np.testing.assert_array_equal(res.fragile, res.flagged != under)
    assert res.fragile.any(), "the list organism flags formatting under its items' sd, and 1e6 flags nothing"
    for j in np.flatnonzero(res.fragile):
        why = res.fragile_reason[j]
        assert f"{res.scale:.3g} (sd of the rewards of 24 base items)" in why and f"{alt:.3g} (given)" in why
        assert why.startswith("flagged under" if res.flagged[j] else "not flagged under")
    text = res.describe()
    assert res.summary()["flagged"].tolist() == res.flagged.tolist()
    robust = [a for a, f, w in zip(res.axes, res.flagged, res.fragile) if f and not w]
    assert text.splitlines()[0] == f"flagged: {', '.join(robust) or 'none'}"
    assert "fragile, not a finding: " + res.axes[int(np.flatnonzero(res.fragile)[0])] in text
    assert f"scale {res.scale:.3g} (sd of the rewards of 24 base items)" in text
    frame = res.to_frame()
    assert list(frame.fragile) == list(res.fragile) and list(frame.fragile_reason) == list(res.fragile_reason)
    assert frame.attrs["scale"] == res.scale and frame.attrs["flag_floor"] == res.min_effect * res.scale
    assert frame.attrs["alt_scale"] == alt


def test_a_bad_scale_is_refused_by_name(list_model, reference):
    items = bank_items(4)
    with pytest.raises(ValueError, match="scale='reference' takes the flag floor from reference pairs"):
        probe(list_model, items, axes=["emoji"], scale="reference")
    for bad in ("pairs", -1.0, 0, True):
        with pytest.raises(ValueError, match="scale must be one of"):
            probe(list_model, items, axes=["emoji"], scale=bad)
