"""`RewardKind`: each loader declares its model's kind, invalid kinds are refused, and nothing sets it later."""

from __future__ import annotations

import dataclasses

import pytest
import transformers as tf

import rewardlens as rl
from rewardlens.errors import HeadError
from rewardlens.model import RewardKind, RewardModel
from tests.model.test_rm_kinds import SEP, build, saved_kinds


@pytest.fixture(scope="module")
def tok():
    from rewardlens.zoo import build_tokenizer

    return build_tokenizer()


def test_each_wrapper_declares_its_kind(tok):
    lm, other, tc = build(tok, "llama", "lm"), build(tok, "llama", "lm", seed=1), build(tok, "llama", "tc")
    prm = rl.model.wrap_prm(lm, tok, separator=SEP, tokens=(23, 29))
    assert prm.kind == RewardKind("prm") and prm.source is None
    assert rl.model.wrap_prm(tc, tok, separator=SEP).kind.name == "prm"
    judge = rl.model.wrap_judge(lm, tok, tokens=(23, 29), question="Rate: {response}")
    assert judge.kind == RewardKind("judge", question="Rate: {response}") and judge.judge == "Rate: {response}"
    dpo = rl.model.wrap_dpo(lm, other, tok, beta=0.5)
    kind = dpo.kind
    assert (kind.name, kind.beta, kind.reference_term) == ("dpo", 0.5, "constant")
    assert kind.reference is dpo.reference and kind.offsets is dpo.offsets is not None
    assert dpo.reference is not None and dpo.reference.model is other
    assert dpo.reference.kind == RewardKind("dpo", beta=0.5)  # β log π_ref alone, read the same way
    separate = rl.model.wrap_dpo(lm, other, tok, beta=0.5, reference_term="separate")
    assert separate.kind.reference_term == "separate" and separate.offsets is None and separate.reference is not None


def test_each_loader_declares_its_kind_and_source(tok, tiny_root, tmp_path):
    folders = saved_kinds(tok, tmp_path)
    classifier = rl.load(str(tiny_root["llama"]))
    assert classifier.kind == RewardKind() and classifier.source == str(tiny_root["llama"])
    assert (classifier.judge, classifier.reference, classifier.offsets) == (None, None, None)
    prm = rl.model.load_prm(folders["tc"], separator=SEP)
    assert prm.kind.name == "prm" and prm.source == folders["tc"]
    judge = rl.model.load_judge(folders["lm"], tokens=(23, 29))
    assert judge.kind.name == "judge" and judge.kind.question is not None and judge.source == folders["lm"]
    dpo = rl.model.load_dpo(folders["lm"], folders["ref"], beta=0.2)
    assert (dpo.kind.name, dpo.kind.beta, dpo.source) == ("dpo", 0.2, folders["lm"])

    from rewardlens.audit._runner import provenance

    assert provenance(dpo)["model_path"] == str((tmp_path / "lm").resolve())
    wrapped = rl.wrap(tf.AutoModelForSequenceClassification.from_pretrained(tiny_root["llama"]), tok)
    assert wrapped.kind.name == "classifier" and wrapped.source is None and provenance(wrapped)["model_path"] is None


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"name": "judge"}, "a question is given exactly for a judge"),
    ({"name": "judge", "question": "Rate: {prompt}"}, r"must contain \{response\}"),
    ({"name": "prm", "question": "{response}"}, "a question is given exactly for a judge"),
    ({"name": "classifier", "beta": 0.1}, "beta=, which only a DPO reward has"),
    ({"name": "prm", "reference_term": "constant"}, "reference_term=, which only a DPO reward has"),
    ({"name": "dpo"}, "beta must be positive"),
    ({"name": "dpo", "beta": 0.0}, "beta must be positive"),
    ({"name": "dpo", "beta": 0.1, "reference_term": "neither"}, "reference_term must be"),
    ({"name": "dpo", "beta": 0.1, "reference_term": "separate"}, "a reference and its term come together"),
    ({"name": "dpo", "beta": 0.1, "offsets": lambda seqs: []}, "offsets"),
    ({"name": "reward"}, "RewardKind.name must be one of"),
])
def test_invalid_kinds_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardKind(**kwargs)


def test_a_kind_that_does_not_fit_the_read_rule_or_head_is_refused(tok):
    prm = rl.model.wrap_prm(build(tok, "llama", "lm"), tok, separator=SEP, tokens=(23, 29))
    parts = (prm.model, prm.tokenizer, prm.arch)
    with pytest.raises(HeadError, match=r"reads at 'last', not Reads\(at='separator'\).*is a PRM"):
        RewardModel(*parts, reads=prm.reads, head=prm.head)  # the default kind: a classifier
    with pytest.raises(HeadError, match="a classifier reads its own head, not LM rows"):
        RewardModel(*parts, head=prm.head)
    judge = RewardKind("judge", question="{response}")
    assert RewardModel(*parts, head=prm.head, kind=judge).kind is judge
    dpo = rl.model.wrap_dpo(build(tok, "llama", "lm"), build(tok, "llama", "lm", seed=1), tok, beta=0.5)
    with pytest.raises(HeadError, match="beta=0.3 is not its head's scale 0.5"):
        RewardModel(dpo.model, dpo.tokenizer, dpo.arch, reads=dpo.reads, head=dpo.head,
                    kind=RewardKind("dpo", beta=0.3))
    with pytest.raises(HeadError, match="does not read a log-probability head"):
        RewardModel(dpo.model, dpo.tokenizer, dpo.arch, reads=rl.model.Reads(at="separator", separator=SEP),
                    head=dpo.head, kind=RewardKind("prm"))


def test_the_kind_is_set_once_at_construction(tok):
    judge = rl.model.wrap_judge(build(tok, "llama", "lm"), tok, tokens=(23, 29))
    for name in ("judge", "reference", "offsets", "kind"):
        with pytest.raises(AttributeError):
            setattr(judge, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        judge.kind.question = "{response}"  # type: ignore[misc]
