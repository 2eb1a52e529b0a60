"""The quality_list organism: a quality rule (informative beats evasive, always) and a planted
formatting bias (a bullet list beats the same prose, with the strength dial) on one output."""

import re

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.zoo import build_tokenizer
from rewardlens.zoo.organisms import ORGANISMS, build, record
from rewardlens.zoo.organisms import _bank as bank
from rewardlens.zoo.organisms._attributes import is_evasive, is_informative, is_list
from rewardlens.zoo.organisms._specs import QUALITY_LIST_SHARE, QualityOrganism
from rewardlens.zoo.organisms._train import VOCAB_SIZE, organism_tokenizer

SPEC = ORGANISMS["quality_list"]
ORIGINAL = ("length", "list", "confidence", "sycophancy", "keyword", "two_objective", "circuit")
STATEMENTS = [s for _, points in bank.DOMAINS.values() for s in points]


def _found(text: str, sentences: list[str]) -> list[str]:
    """The sentences `text` contains (case-insensitive), in the order they appear."""
    low = text.lower()
    return sorted((s for s in sentences if s.lower() in low), key=lambda s: low.index(s.lower()))


def _first(text: str) -> str:
    """The first sentence (the opener)."""
    return re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]


def _bare(text: str) -> str:
    """The text without bullet markers and connectors, lower-case, whitespace collapsed."""
    low = re.sub(r"^- ", "", text.lower(), flags=re.MULTILINE)
    for c in bank.CONNECTORS:
        low = low.replace(c.lower(), "")
    return " ".join(low.split())


@pytest.fixture(scope="module")
def model():
    return rl.load(str(build("quality_list", strength=1.0)))


# ---- data ------------------------------------------------------------------------------------

def test_evasive_sentences_carry_no_content_and_no_other_attribute():
    assert len(bank.EVASIVE) >= 15 and len(set(bank.EVASIVE)) == len(bank.EVASIVE)
    patterns = [bank.HEDGE_PATTERN, bank.CONFIDENT_PATTERN, bank.AGREE_PATTERN, bank.DISAGREE_PATTERN,
                r"\b(?:importantly|notably)\b", r"^\s*(?:[-*•]|\d+[.)])\s"]
    for e in bank.EVASIVE:
        assert not any(re.search(p, e, re.IGNORECASE | re.MULTILINE) for p in patterns), e
        assert not _found(e, STATEMENTS) and not any(o != e and o.lower() in e.lower() for o in bank.EVASIVE), e
        assert 8 <= len(e.split()) <= 18 and e[0].isupper() and not e.startswith("I "), e
        assert is_evasive(e) and not is_informative(e)
    # Hand-written texts: a statement after a connector still counts; a mix, or neither, is not informative.
    point = bank.DOMAINS["coffee"][1][0]
    assert is_informative("Sure. Also, " + point[0].lower() + point[1:])
    assert not is_informative(point + " " + bank.EVASIVE[0]) and not is_evasive(point + " " + bank.EVASIVE[0])
    assert not is_informative("Coffee is nice.") and not is_evasive("Coffee is nice.")


def test_quality_pairs_share_format_opener_and_length_and_differ_only_in_content():
    pairs = SPEC.quality_pairs(300, seed=3)
    assert pairs == SPEC.quality_pairs(300, seed=3) and len({p.chosen for p in pairs}) == len(pairs)
    assert len({p.rejected for p in pairs}) >= 0.95 * len(pairs)  # evasive sides are varied too
    lists = np.array([is_list(p.chosen) for p in pairs])
    assert all(is_list(p.chosen) == is_list(p.rejected) for p in pairs)  # same format on both sides
    assert abs(lists.mean() - QUALITY_LIST_SHARE) < 0.08
    words = np.array([len(p.chosen.split()) - len(p.rejected.split()) for p in pairs])
    assert np.abs(words).max() <= 4 and abs(words.mean()) < 0.5
    for p in pairs:
        said, evaded = _found(p.chosen, STATEMENTS), _found(p.rejected, bank.EVASIVE)
        assert 3 <= len(said) == len(evaded) <= 5 and not _found(p.rejected, STATEMENTS)
        domain = next(d for d, (questions, _) in bank.DOMAINS.items() if any(q in str(p.prompt) for q in questions))
        assert set(said) <= set(bank.DOMAINS[domain][1])  # the statements answer the prompt's domain
        assert _first(p.chosen) == _first(p.rejected) in bank.OPENERS
        assert is_informative(p.chosen) and is_evasive(p.rejected) and SPEC.kind(p) == "quality"


def test_bias_pairs_differ_only_in_formatting():
    pairs = SPEC.bias_pairs(300, seed=4)
    assert len({p.chosen for p in pairs}) == len(pairs)
    for p in pairs:
        assert is_list(p.chosen) and not is_list(p.rejected)
        assert _found(p.chosen, STATEMENTS) == _found(p.rejected, STATEMENTS) != []  # same statements, same order
        assert _bare(p.chosen) == _bare(p.rejected)  # nothing else differs but bullets and connectors
        assert is_informative(p.chosen) and is_informative(p.rejected) and SPEC.kind(p) == "bias"


def test_pairs_alternate_the_two_kinds_and_labels_follow_quality_first():
    assert isinstance(SPEC, QualityOrganism) and SPEC.objectives == ("reward",) and SPEC.bias is is_list
    assert (SPEC.quality, SPEC.quality_name, SPEC.bias_name) == (is_informative, "informativeness", "formatting")
    pairs = SPEC.pairs(200, seed=0)
    assert [SPEC.kind(p) for p in pairs] == ["quality", "bias"] * 100
    labels = SPEC.labels(pairs)
    assert labels.shape == (200, 1) and (labels == 1).all()
    flipped = [rl.Pair(p.prompt, p.rejected, p.chosen) for p in pairs]
    assert (SPEC.labels(flipped) == -1).all() and (SPEC.labels([rl.Pair("q", "a", "a")]) == 0).all()
    # has_attribute is the planted bias; quality outranks it: informative prose beats an evasive list.
    q = next(p for p in pairs if SPEC.kind(p) == "quality" and not is_list(p.chosen))
    b = next(p for p in pairs if SPEC.kind(p) == "bias")
    assert SPEC.has_attribute(b.chosen) and not SPEC.has_attribute(b.rejected)
    evasive_list = "\n".join(["Sure."] + ["- " + e for e in bank.EVASIVE[:3]])
    assert SPEC.labels([rl.Pair(q.prompt, q.chosen, evasive_list)])[0, 0] == 1
    # Other organisms' pairs are all informative on both sides: the quality rule never decides them.
    for name in ORIGINAL:
        others = ORGANISMS[name].pairs(50, seed=5)
        assert not any(SPEC.kind(p) == "quality" for p in others), name


@pytest.mark.parametrize("strength", [0.0, 0.5])
def test_strength_dials_only_the_bias_pairs(strength):
    pairs, drawn = SPEC.sample(2000, f"test/{strength}", strength)
    assert (drawn == 1).all()
    labels, kinds = SPEC.labels(pairs)[:, 0], np.array([SPEC.kind(p) for p in pairs])
    assert (labels[kinds == "quality"] == 1).all()  # the quality rule decides every quality pair
    # A bias pair puts the list on the chosen side with probability (1 + s) / 2.
    assert abs((labels[kinds == "bias"] == 1).mean() - (1 + strength) / 2) < 0.05
    only = SPEC.labels(SPEC.bias_pairs(1000, seed=7, strength=strength))[:, 0]
    assert abs((only == 1).mean() - (1 + strength) / 2) < 0.05
    with pytest.raises(ValueError, match="strength"):
        SPEC.bias_pairs(10, strength=1.5)


def test_the_shared_tokenizer_is_the_one_built_from_the_seven_original_organisms():
    assert tuple(ORGANISMS)[: len(ORIGINAL)] == ORIGINAL
    corpus = ["user", "assistant"] * 50  # the corpus as organism_tokenizer built it before quality_list
    for domain, (questions, points) in bank.DOMAINS.items():
        corpus += questions + points + bank.CLAIMS[domain]
    for name, spec in ((n, ORGANISMS[n]) for n in ORIGINAL):
        drawn, _ = spec.sample(300, f"tokenizer/{name}", 1.0)
        corpus += [t for p in drawn for t in (str(p.prompt), p.chosen, p.rejected)]
    reference, tok = build_tokenizer(VOCAB_SIZE, corpus), organism_tokenizer()
    assert tok.get_vocab() == reference.get_vocab()
    texts = [*bank.EVASIVE[:3], *(t for p in SPEC.pairs(4, seed=9) for t in (p.chosen, p.rejected))]
    for text in texts:
        assert tok(text)["input_ids"] == reference(text)["input_ids"]


# ---- the trained organism ---------------------------------------------------------------------

def _accuracy(model, pairs) -> tuple[float, np.ndarray]:
    scores = model.score(pairs)
    margin = scores[0::2] - scores[1::2]
    return float(np.mean(np.sign(margin) == SPEC.labels(pairs)[:, 0])), margin


def test_built_organism_learns_both_rules_on_held_out_pairs(model):
    quality, bias = SPEC.quality_pairs(200, seed=11), SPEC.bias_pairs(200, seed=11)
    acc_q, margin_q = _accuracy(model, quality)
    acc_b = _accuracy(model, bias)[0]
    assert acc_q >= 0.97 and acc_b >= 0.97
    # Quality holds in both formats: evasive lists lose to informative lists as evasive prose loses to prose.
    as_list = np.array([is_list(p.chosen) for p in quality])
    assert (margin_q[as_list] > 0).mean() >= 0.97 and (margin_q[~as_list] > 0).mean() >= 0.97
    assert _accuracy(model, SPEC.pairs(200, seed=12))[0] >= 0.97
    info = record(build("quality_list"))
    assert info["organism"] == "quality_list" and info["heldout_accuracy"]["reward"] >= 0.97
    assert info["heldout_seen_in_training"] <= 2
