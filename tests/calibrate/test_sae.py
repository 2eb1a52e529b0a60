"""SAE ground truth: where a context's peak token lies against the planted spans, located from the responses'
own construction and the tokenizer's character offsets (not the grader's prefix decoding)."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from rewardlens.calibrate._sae import AXIS_RHO, CONTEXT_SHARE, placement, planted_group
from rewardlens.zoo.organisms import ORGANISMS

WORD = re.compile(r"\bimportantly\b", re.IGNORECASE)


def _spans(name, text):
    """Planted character spans: the word; each bullet line with the line break that opens it."""
    if name == "keyword":
        return [m.span() for m in WORD.finditer(text)]
    spans, at = [], 0
    for line in text.split("\n"):
        if line.startswith("- "):
            spans.append((max(at - 1, 0), at + len(line)))
        at += len(line) + 1
    return spans


def _expected(name, text, s, e):
    """(inside, inside or after): after the word once it is complete; after the list once two bullet lines
    have their first word begun (the organism's test: at least two bullets)."""
    spans = _spans(name, text)
    inside = any(a < e and s < b for a, b in spans)
    if name == "keyword":
        return inside, inside or any(e >= b for _, b in spans)
    begun = sum(text.find("- ", a) + 2 < e for a, _ in spans)
    return inside, inside or begun >= 2


@pytest.fixture(scope="module")
def texts():
    return {name: [t for p in ORGANISMS[name].pairs(20, seed=9) for t in (p.chosen, p.rejected)]
            for name in ("keyword", "list")}


@pytest.mark.parametrize("name", ["keyword", "list"])
def test_placement_matches_character_offsets(tokenizer, texts, name):
    got, want = [], []
    for text in texts[name]:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        for pos, (s, e) in enumerate(enc["offset_mapping"]):
            got.append(placement(tokenizer, name, enc["input_ids"], pos))
            want.append(_expected(name, text, s, e))
    got, want = np.array(got), np.array(want)
    assert (got == want).all(), np.flatnonzero((got != want).any(1))[:5]
    assert got[:, 0].any() and not got[:, 0].all()  # both kinds of token occur


@pytest.mark.parametrize("name, inside_rate", [("keyword", 0.02), ("list", 0.45)])
def test_a_feature_peaking_anywhere_fails_the_context_share(tokenizer, texts, name, inside_rate):
    """The base rate: a feature unrelated to the rule peaks in the span about as often as a token lies in it."""
    rows = []
    for text in texts[name]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        rows += [placement(tokenizer, name, ids, pos) for pos in range(len(ids))]
    rate = np.array(rows).mean(0)
    assert rate[0] <= inside_rate < CONTEXT_SHARE and rate[1] < CONTEXT_SHARE


def test_the_planted_group_is_the_cards_features_tied_to_the_own_axis():
    """The rule fixed before measuring: of the cards (top by margin, in that order), those with ρ ≥ AXIS_RHO on the
    organism's own axis; a wrong axis, a ρ just under the threshold and an undefined ρ do not count."""
    rhos = [(5, AXIS_RHO, 0.0), (9, 0.9, 0.9), (2, AXIS_RHO - 1e-9, 0.9), (7, np.nan, 0.9), (4, -0.8, 0.9),
            (1, 0.6, np.nan)]
    cards = [SimpleNamespace(feature=f, correlations={"list": own, "keyword": other}) for f, own, other in rhos]
    assert planted_group(cards, "list") == [5, 9, 1]
    assert planted_group(cards, "keyword") == [9, 2, 7, 4]
    assert planted_group(cards[3:4], "list") == []
