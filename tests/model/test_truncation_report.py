"""Left truncation that removes most of a prompt is reported, once per call, naming each sequence."""

from __future__ import annotations

import warnings

import pytest

import rewardlens as rl
from rewardlens.errors import RewardLensWarning

LONG = " ".join(["the question goes on and on about many things"] * 6)


def _lengths(root: str, pair: rl.Pair) -> tuple[int, int]:
    """(tokens of the chosen side, tokens before its response) with no limit."""
    model = rl.load(root)
    seqs, _ = model.encode([pair])
    assert seqs[0].prompt_length is not None
    return len(seqs[0].ids), seqs[0].prompt_length()


def test_a_prompt_cut_away_is_reported_per_pair(tiny_root) -> None:
    root = str(tiny_root["llama"])
    cut, kept = rl.Pair(LONG, "Yes.", "No."), rl.Pair("Hi?", "Yes.", "No.")
    total, prompt = _lengths(root, cut)
    limit = total - prompt // 2 - 2  # removes just over half of the long prompt; the short pair fits
    assert _lengths(root, kept)[0] <= limit
    model = rl.load(root, max_length=limit, truncation="left")
    with pytest.warns(RewardLensWarning, match="left truncation removed more than half") as record:
        seqs, _ = model.encode([kept, cut])
    message = " ".join(str(w.message) for w in record if "left truncation" in str(w.message))
    assert "2 sequence(s)" in message and "pair 1 (chosen)" in message and "pair 1 (rejected)" in message
    assert "pair 0" not in message and "--max-length" in message
    assert all(len(s.ids) <= limit for s in seqs)
    assert seqs[2].cut is not None and seqs[2].cut[2] == prompt and seqs[2].cut[1] > prompt / 2


def test_a_small_cut_or_no_cut_is_not_reported(tiny_root) -> None:
    root = str(tiny_root["llama"])
    pair = rl.Pair(LONG, "Yes.", "No.")
    total, prompt = _lengths(root, pair)
    model = rl.load(root, max_length=total - 3, truncation="left")  # 3 of many prompt tokens
    with warnings.catch_warnings():
        warnings.simplefilter("error", RewardLensWarning)
        seqs, _ = model.encode([pair])
        rl.load(root, max_length=total, truncation="left").encode([pair])
    assert seqs[0].cut is None and len(seqs[0].ids) == total - 3
