"""`stats.wilson` against statsmodels-free yardsticks: the closed form's textbook values and coverage; its
weighted sum (MOVER-Wilson) against the formula by hand; strict JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rewardlens.stats import json_number, to_json, wilson, wilson_sum


def test_wilson_matches_the_textbook_example():
    # Newcombe (1998), method 3: 81 of 263 gives [0.2553, 0.3662] at 95%.
    lo, hi = wilson(81, 263)
    assert lo == pytest.approx(0.2553, abs=1e-4) and hi == pytest.approx(0.3662, abs=1e-4)


def test_wilson_is_not_empty_at_the_edges_and_nan_without_data():
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and 0.2 < hi < 0.35  # 0.2775 by the closed form
    lo, hi = wilson(10, 10)
    assert 0.65 < lo < 0.8 and hi == pytest.approx(1.0)
    assert all(np.isnan(wilson(0, 0)))
    with pytest.raises(ValueError, match="successes must be in"):
        wilson(5, 3)


def test_wilson_covers_about_its_level_on_average_over_p():
    # Wilson's coverage oscillates with p at small n; its mean over p sits near the nominal level.
    rng = np.random.default_rng(0)
    n = 40
    cover = [np.mean([lo <= p <= hi for lo, hi in (wilson(int(k), n) for k in rng.binomial(n, p, 1000))])
             for p in np.linspace(0.1, 0.9, 9)]
    assert 0.93 < np.mean(cover) < 0.97


def test_ranked_puts_nan_last_keeps_ties_in_order_and_cuts_at_k():
    from rewardlens.stats import ranked

    score = np.array([1.0, np.nan, 3.0, -np.inf, 3.0, np.nan, 0.0])
    assert ranked(score).tolist() == [2, 4, 0, 6, 3, 1, 5]  # 3 before 3 as given; -inf before NaN
    assert ranked(score, 2).tolist() == [2, 4]
    assert ranked(np.array([])).tolist() == []


def test_top_parts_ranks_by_mean_abs_not_abs_mean():
    from rewardlens.stats import top_parts

    # Column 0 flips sign (|mean| 0, mean|.| 2); column 1 is steady (1); column 2 is NaN on one row.
    values = np.array([[2.0, 1.0, np.nan], [-2.0, 1.0, 5.0]])
    assert top_parts(values).tolist() == [0, 1, 2]
    assert top_parts(values, 1).tolist() == [0]
    assert top_parts(np.zeros((0, 3))).tolist() == [0, 1, 2]  # no rows: every part ties, part order
    with pytest.raises(ValueError, match=r"\[n, P\] array, got shape \(3,\)"):
        top_parts(np.ones(3))


def test_wilson_sum_of_one_stratum_is_its_wilson_interval():
    assert wilson_sum(np.array([81]), np.array([263]), np.array([1.0])) == pytest.approx(wilson(81, 263))


def test_wilson_sum_does_not_collapse_where_every_stratum_is_all_right_or_all_wrong():
    # 3 of 3 right and 0 of 5 right, weighted by counts: 0.375, which a bootstrap within strata gives as a point.
    k, n = np.array([3, 0]), np.array([3, 5])
    c = n / n.sum()
    lo, hi = wilson_sum(k, n, c)
    (l1, u1), (l2, u2) = wilson(3, 3), wilson(0, 5)
    # MOVER by hand: θ − √Σ (c p̂ − c l)², θ + √Σ (c u − c p̂)²
    assert lo == pytest.approx(0.375 - np.hypot(c[0] * (1 - l1), c[1] * (0 - l2)))
    assert hi == pytest.approx(0.375 + np.hypot(c[0] * (u1 - 1), c[1] * (u2 - 0)))
    assert 0 < lo < 0.375 < hi < 1
    assert all(np.isnan(wilson_sum(k, n, np.array([np.nan, 1.0]))))


def test_strict_json_has_null_for_every_non_finite_number():
    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")

    data = {"a": float("nan"), "b": [np.float32(np.inf), -np.inf, 1.5], "c": np.array([np.nan, 2.0]),
            "d": (np.int64(3), np.bool_(True)), 4: None}
    text = to_json(data)
    assert json.loads(text, parse_constant=refuse) == {"a": None, "b": [None, None, 1.5], "c": [None, 2.0],
                                                       "d": [3, True], "4": None}
    assert json_number(float("nan")) is None and json_number(np.float64(2.5)) == 2.5
