"""A process reward model scores the last step of every answer, even one that does not end with the separator.

PRMs are trained with a step tag after every step, the last included (Math-Shepherd's `ки`, PRM800K-style
step tokens), so an answer whose last line has no separator has one appended after its last token
(`Reads.final='append'`, the default). Yardstick: the chat template's own ids with the separator inserted
by hand after the content's last token, read off the Hugging Face model's own logits.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.errors import RewardLensWarning, TokenizationError
from tests.model.test_rm_kinds import SEP, build, conversations, logits, template_ids

PAIR = rl.Pair("What is 2+3?", "step one\nstep two", "step one\nstep three, maybe")
PLUS, MINUS = 23, 29


@pytest.fixture(scope="module")
def tok():
    from rewardlens.zoo import build_tokenizer

    return build_tokenizer()


def _by_hand(tok, lm, append: bool, last_token: bool = False) -> tuple[list[float], list[list[int]]]:
    """Each side's summed step score `logit(+) − logit(−)` and step positions: at the content's separators,
    plus an appended separator (`append`) or the content's last token (`last_token`)."""
    sep = tok.encode(SEP, add_special_tokens=False)[0]
    rewards, where = [], []
    for conv in conversations([PAIR]):
        ids, start, suffix = template_ids(tok, conv)
        end = len(ids) - suffix
        assert ids[end - 1] != sep  # the answer's last step is open: the case under test
        at = [t for t in range(start, end) if ids[t] == sep]
        if append:
            ids = ids[:end] + [sep] + ids[end:]
            at.append(end)  # right after the last token of the last step
        elif last_token:
            at.append(end - 1)
        z = logits(lm, ids)[at]
        rewards.append(float((z[:, PLUS] - z[:, MINUS]).sum()))
        where.append(at)
    return rewards, where


def test_the_last_step_is_scored_at_an_appended_separator(tok):
    lm = build(tok, "llama", "lm")
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(PLUS, MINUS), combine="sum")
    own, where = _by_hand(tok, lm, append=True)
    att = rl.attribute(rm, [PAIR])
    steps = att.steps.to_frame()
    assert steps.groupby("sequence").size().tolist() == [2, 2]
    assert [steps.position[steps.sequence == i].tolist() for i in (0, 1)] == where
    np.testing.assert_allclose(rm.score([PAIR]), own, atol=1e-4)
    np.testing.assert_allclose(att.values.sum(1) + att.constant, own, atol=1e-4)
    per_step = steps[att.names].sum(1) + steps["constant"]
    np.testing.assert_allclose(per_step, steps["reward"], atol=1e-4)
    # The reward changes by the last step's own score: the old reading (one step) is far from it.
    one_step, _ = _by_hand(tok, lm, append=False)
    assert np.abs(np.array(own) - np.array(one_step)).min() > 1e-2


def test_ignoring_the_last_step_warns_and_last_token_reads_it_in_place(tok):
    lm = build(tok, "llama", "lm")
    ignore = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(PLUS, MINUS), combine="sum", final="ignore")
    with pytest.warns(RewardLensWarning, match=r"2 of 2 responses end without the step separator.*final='append'"):
        scores = ignore.score([PAIR])
    np.testing.assert_allclose(scores, _by_hand(tok, lm, append=False)[0], atol=1e-4)
    in_place = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(PLUS, MINUS), combine="sum", final="last-token")
    own, where = _by_hand(tok, lm, append=False, last_token=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        att = rl.attribute(in_place, [PAIR])
    steps = att.steps.to_frame()
    assert [steps.position[steps.sequence == i].tolist() for i in (0, 1)] == where
    np.testing.assert_allclose(att.values.sum(1) + att.constant, own, atol=1e-4)


def test_an_answer_ending_with_the_separator_is_read_as_it_is(tok):
    lm = build(tok, "llama", "lm")
    closed = rl.Pair(PAIR.prompt, PAIR.chosen + SEP, PAIR.rejected + SEP)
    rm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(PLUS, MINUS), combine="sum")
    assert [len(s.ids) for s in rm.encode([closed])[0]] == [len(s.ids) for s in rm.encode([PAIR])[0]]
    np.testing.assert_allclose(rm.score([closed]), rm.score([PAIR]), atol=1e-5)


def test_the_appended_separator_keeps_to_max_length(tok):
    lm = build(tok, "llama", "lm")
    limit = max(len(template_ids(tok, conv)[0]) for conv in conversations([PAIR]))
    strict = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(PLUS, MINUS), max_length=limit)
    with pytest.raises(TokenizationError, match=f"has {limit} tokens, the limit, before the separator closing"):
        strict.score([PAIR])
    cut = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(PLUS, MINUS), combine="sum", max_length=limit,
                      truncation="left")
    sep = tok.encode(SEP, add_special_tokens=False)[0]
    own = []
    for conv, seq in zip(conversations([PAIR]), cut.encode([PAIR])[0]):
        ids, _, suffix = template_ids(tok, conv)
        closed = ids[:len(ids) - suffix] + [sep] + ids[len(ids) - suffix:]
        assert seq.ids == closed[max(len(closed) - limit, 0):]  # one token cut from the left where it overflows
        assert seq.reads is not None and seq.ids[seq.reads[-1]] == sep
        z = logits(lm, seq.ids)[list(seq.reads)]
        own.append(float((z[:, PLUS] - z[:, MINUS]).sum()))
    np.testing.assert_allclose(cut.score([PAIR]), own, atol=1e-4)


def test_final_is_validated():
    with pytest.raises(ValueError, match="final says how a process reward model's last step is read"):
        rl.model.Reads(at="response", final="ignore")
    with pytest.raises(ValueError, match="one of"):
        rl.model.Reads(at="separator", separator="\n", final="drop")  # type: ignore[arg-type]
