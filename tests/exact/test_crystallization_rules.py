"""`Lens.crystallization` rules on a hand-built lens whose margin crosses the threshold and falls back."""

import numpy as np
import pytest

from rewardlens.exact import Lens


def _lens(margins: list[list[float]]) -> Lens:
    """A 3-layer lens whose chosen rows are `margins` and rejected rows are zero (margin = chosen)."""
    m = np.asarray(margins, dtype=np.float32)
    rows = np.zeros((2 * len(m), m.shape[1]), dtype=np.float32)
    rows[0::2] = m
    reward = rows[:, -1].copy()
    return Lens(linear=rows, normed=rows, reward=reward, linear_objectives=rows[:, None],
                normed_objectives=rows[:, None], rows=[str(i) for i in range(len(rows))], is_pairs=True)


LENS = _lens([
    [0.0, 0.6, 0.2, 1.0],    # reaches half the final margin at depth 1, falls back at 2, back at 3
    [0.1, -0.7, -0.8, -1.0],  # wrong side at depth 0, then past half of a negative final margin for good
    [0.3, 0.1, 0.45, 1.0],   # never falls back once it crosses: both rules agree (depth 3)
    [0.5, -0.5, 0.2, 0.0],   # no final margin: no side to reach
])


def test_first_and_stays_differ_where_the_margin_falls_back():
    # Hand computation with fraction 0.5 and L = 3: pair 0 passes at depths 1 and 3 (0.6, 1.0 ≥ 0.5)
    # and fails at 2 (0.2); pair 1 passes at 1, 2, 3; pair 2 only at 3 (0.45 < 0.5).
    np.testing.assert_array_equal(LENS.crystallization(rule="first")[:3], [1 / 3, 1 / 3, 1.0])
    np.testing.assert_array_equal(LENS.crystallization(rule="stays")[:3], [1.0, 1 / 3, 1.0])
    np.testing.assert_array_equal(LENS.crystallization()[:3], LENS.crystallization(rule="stays")[:3])


def test_a_lower_fraction_moves_the_first_crossing_earlier():
    # fraction 0.25: pair 2 passes at depth 0 (0.3 ≥ 0.25), fails at 1 (0.1), passes at 2 and 3.
    assert LENS.crystallization(fraction=0.25, rule="first")[2] == 0.0
    assert LENS.crystallization(fraction=0.25, rule="stays")[2] == pytest.approx(2 / 3)


def test_both_rules_are_nan_without_a_final_margin_and_refuse_unknown_rules():
    for rule in ("first", "stays"):
        assert np.isnan(LENS.crystallization(rule=rule)[3])
    with pytest.raises(ValueError, match="rule"):
        LENS.crystallization(rule="last")
