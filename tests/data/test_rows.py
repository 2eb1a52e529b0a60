"""The row layout and the effect sign, checked against the layout written out by hand (row 2i chosen, 2i+1 rejected)."""

import numpy as np
import pytest
import torch

from rewardlens.data import chosen, effect, margin, pair_of, rejected
from rewardlens.data.internal import interleave, is_chosen, pair_rows, pair_span, rows_of


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_interleave_inverts_the_sides(axis):
    rows = np.random.default_rng(0).normal(size=(6, 4, 8))
    rows = np.moveaxis(rows, 0, axis)  # the 6 rows (3 pairs) along `axis`
    back = interleave(chosen(rows, axis), rejected(rows, axis), axis)
    assert np.array_equal(back, rows)
    assert np.array_equal(interleave(chosen(torch.as_tensor(rows), axis), rejected(torch.as_tensor(rows), axis), axis),
                          torch.as_tensor(rows))


def test_interleave_places_rows_by_hand():
    c, r = np.array([[1.0], [2.0]]), np.array([[10.0], [20.0]])
    assert interleave(c, r)[:, 0].tolist() == [1.0, 10.0, 2.0, 20.0]
    with pytest.raises(ValueError, match="one shape"):
        interleave(c, r[:1])


def test_is_chosen_and_margin_by_hand():
    assert is_chosen(5).tolist() == [True, False, True, False, True]
    r = np.array([3.0, 1.0, 0.5, 2.0])
    assert margin(r).tolist() == [3.0 - 1.0, 0.5 - 2.0]


def test_effect_is_clean_minus_patched_and_broadcasts_per_pair():
    clean = np.array([2.0, -1.0])
    patched = np.array([[0.5, 2.0, 3.0], [-1.0, 0.0, 4.0]])  # [n pairs, parts]
    want = np.array([[clean[i] - patched[i, j] for j in range(3)] for i in range(2)])
    assert np.array_equal(effect(clean, patched), want)
    assert effect(1.5, 0.5) == 1.0
    assert np.array_equal(effect(0.0, np.array([0.25, -1.0])), np.array([-0.25, 1.0]))
    t = effect(torch.tensor([1.0, 2.0]), torch.tensor([[0.0], [3.0]]))
    assert t.tolist() == [[1.0], [-1.0]]


def test_pair_indices_by_hand():
    assert [rows_of(i) for i in range(3)] == [(0, 1), (2, 3), (4, 5)]
    assert all(pair_of(rows_of(i)[0]) == (i, "chosen") and pair_of(rows_of(i)[1]) == (i, "rejected")
               for i in range(4))
    assert pair_rows(np.array([2, 0])).tolist() == [4, 5, 0, 1]
    assert list(range(10))[pair_span(1, 3)] == [2, 3, 4, 5]
