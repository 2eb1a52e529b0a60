"""The PRM and DPO organisms and their graders: the planted truth holds on the models' own forwards,
rewardlens reads them as those forwards do, training is seeded, and every grade passes.

Yardsticks: the Hugging Face models' own logits (one unpadded or right-padded forward per
sequence, separators found from the chat template's ids), the organisms' text rules, and the
seeded initial weights the untouched parts must still hold.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers as tf

import rewardlens as rl
from rewardlens.calibrate import GRADERS, KindBench, calibrate, grade_dpo, grade_prm
from rewardlens.cli import main
from rewardlens.cli import organisms as cli_organisms
from rewardlens.zoo.organisms import (
    KIND_ORGANISMS as KINDS,
)
from rewardlens.zoo.organisms import (
    build,
    dpo_paths,
    implicit_rewards,
    open_kind,
    prm_accuracy,
    record,
    step_scores,
)
from rewardlens.zoo.organisms._dpo import DPO, initial_lm, train_dpo
from rewardlens.zoo.organisms._prm import PRM, initial_prm, train_prm
from rewardlens.zoo.organisms._train import organism_tokenizer, part_parameters

PAIRS = 40


@pytest.fixture(scope="module")
def kinds():
    """Both organisms, trained once per machine (cached on disk): {name: folder}."""
    return {name: build(name) for name in KINDS}


@pytest.fixture(scope="module")
def card(kinds):
    return calibrate(graders=[grade_prm, grade_dpo], organisms=list(KINDS), n_pairs=60)


def _outside(model: torch.nn.Module, part: str) -> dict[str, torch.Tensor]:
    """Every entry of `model` outside `part`, by parameter name (the part's own entries zeroed)."""
    masks = {id(p): m for p, m in part_parameters(model, part)}
    out = {}
    for name, p in model.named_parameters():
        m = masks.get(id(p), "absent")
        if m is None:
            continue
        keep = torch.ones_like(p) if isinstance(m, str) else 1 - m
        out[name] = (p.detach() * keep).clone()
    return out


def test_every_grade_passes(card):
    failures = [(r.organism, r.check, r.value) for r in card.failures]
    assert card.passed and not failures, failures
    frame = card.to_frame()
    assert set(frame["organism"]) == set(KINDS) and card.settings["organisms"] == list(KINDS)
    checks = set(frame["check"])
    assert {"held-out pair accuracy (min over steps)", "held-out step accuracy (both sides)",
            "held-out pair accuracy (implicit reward)", "max |reward - (sum of parts + constant)|",
            "rank of attn_L1_H2 by mean margin (head level)", "rank of attn_L1_H2 by mean noising effect (head level)",
            "share of pairs whose largest step-score gap is the hedged step",
            "share of pairs whose largest per-token reward gap is at the keyword",
            "median crystallization depth (linear, fraction 0.5)"} <= checks
    assert set(frame["instrument"]) == {"organism", "attribution", "patching", "lens"}
    # Margins, not just passes: the organisms are far from their thresholds, so a rerun cannot flip them.
    value = dict(zip(zip(frame["organism"], frame["check"]), frame["value"]))
    assert value[("prm_steps", "held-out step accuracy (both sides)")] >= 0.99
    assert value[("dpo_keyword", "held-out pair accuracy (implicit reward)")] >= 0.99
    assert value[("prm_steps", "share of the |mean margin| on attn_L1_H2 (head level)")] >= 0.97
    assert value[("dpo_keyword", "share of the |mean margin| on attn_L1_H2 (head level)")] >= 0.97


def test_graders_join_the_suite_and_the_cli():
    assert GRADERS[-2:] == [grade_prm, grade_dpo]
    assert set(cli_organisms.KINDS) == set(KINDS) and not set(KINDS) & set(cli_organisms.ORGANISMS)


def test_cli_calibrates_a_kind(kinds, capsys):
    assert main(["calibrate", "--organism", "prm_steps", "--n-pairs", "20", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["settings"]["organisms"] == ["prm_steps"]
    assert {r["organism"] for r in data["rows"]} == {"prm_steps"}


def test_prm_reads_what_its_own_forward_says(kinds):
    path, spec = kinds["prm_steps"], PRM
    rec = record(path)
    assert rec["kind"] == "prm" and rec["planted_part"] == spec.planted_part == "attn_L1_H2"
    rm = rl.model.load_prm(str(path), separator="\n", combine="min")
    pairs = spec.pairs(PAIRS, seed=5)
    texts = [(str(p.prompt), t) for p in pairs for t in (p.chosen, p.rejected)]
    own = step_scores(rm.model, rm.tokenizer, texts)  # HF logits at the template's separators
    np.testing.assert_allclose(rm.score(pairs), [s.min() for s in own], atol=1e-4)
    # The planted truth on the model's own forward: hedged steps below zero, the others above.
    truth = np.concatenate([spec.step_labels(t) for _, t in texts])
    scores = np.concatenate(own)
    assert np.all((scores > 0) == truth) and np.abs(scores).min() > 1.0
    assert prm_accuracy(rm.model, rm.tokenizer, pairs)["wrong_step"] == 1.0
    # Only the planted head trained: every other entry is still the seeded initial value.
    start, now = _outside(initial_prm(0), spec.planted_part), _outside(rm.model, spec.planted_part)
    assert start.keys() == now.keys() and all(torch.equal(start[k], now[k]) for k in start)


def test_dpo_reads_what_its_own_forward_says(kinds):
    path, spec = kinds["dpo_keyword"], DPO
    rec = record(path)
    assert rec["kind"] == "dpo" and rec["planted_part"] == spec.planted_part and rec["keyword"] == "Importantly"
    policy_path, reference_path = dpo_paths(path)
    rm = rl.model.load_dpo(str(policy_path), str(reference_path), beta=spec.beta)
    pairs = spec.pairs(PAIRS, seed=5)
    policy = tf.AutoModelForCausalLM.from_pretrained(policy_path).eval()
    reference = tf.AutoModelForCausalLM.from_pretrained(reference_path).eval()
    own = implicit_rewards(policy, reference, rm.tokenizer, pairs, spec.beta)
    np.testing.assert_allclose(rm.score(pairs), own.reshape(-1), atol=1e-4)
    assert np.all(own[:, 0] - own[:, 1] > 0.2)  # the implicit reward prefers the keyword, by a margin
    # Equal token counts on both sides (patching maps read t to read t), the keyword on the chosen side.
    tok = rm.tokenizer
    for p in pairs:
        ids = [tok.apply_chat_template(p.conversation(s), tokenize=True, return_dict=False)
               for s in ("chosen", "rejected")]
        assert len(ids[0]) == len(ids[1]) and spec.has_attribute(p.chosen) and not spec.has_attribute(p.rejected)
    # Only the planted head moved away from the reference: the policy started as its exact copy.
    assert all(torch.equal(a, b) for a, b in zip(_outside(policy, spec.planted_part).values(),
                                                 _outside(reference, spec.planted_part).values()))
    assert all(torch.equal(a, b) for a, b in zip(reference.state_dict().values(), initial_lm(0).state_dict().values()))
    assert isinstance(open_kind(path), rl.RewardModel)


def test_step_pairs_are_minimal():
    for p in PRM.pairs(200, seed=3):
        chosen, rejected = p.chosen.split("\n"), p.rejected.split("\n")
        k = PRM.wrong_step(p)
        assert len(chosen) == len(rejected) and sum(a != b for a, b in zip(chosen, rejected)) == 1
        assert chosen[k] != rejected[k] and all(PRM.step_labels(p.chosen))


def test_training_is_seeded():
    """Two short trainings from one seed give the same weights; another seed does not."""
    short_prm = replace(PRM, recipe=replace(PRM.recipe, n_train=64))
    a, b, c = (train_prm(short_prm, 1.0, s)[0] for s in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.score.weight, c.score.weight)
    short_dpo = replace(DPO, recipe=replace(DPO.recipe, n_train=32))
    first, second = train_dpo(short_dpo, 1.0, 0)[0], train_dpo(short_dpo, 1.0, 0)[0]
    assert all(torch.equal(x, y) for x, y in zip(first.state_dict().values(), second.state_dict().values()))
    moved = first.model.layers[1].self_attn.q_proj.weight
    assert not torch.equal(moved, initial_lm(0).model.layers[1].self_attn.q_proj.weight)


def test_graders_fail_on_an_untrained_prm(kinds):
    bench = KindBench(organisms=[], kinds=["prm_steps"], n_pairs=20)
    tok = organism_tokenizer()
    bench._kind_models["prm_steps"] = rl.model.wrap_prm(initial_prm(0).eval(), tok, separator="\n")
    failed = {r.check for r in grade_prm(bench) if not r.passed}
    assert {"held-out step accuracy (both sides)", "rank of attn_L1_H2 by mean margin (head level)",
            "share of pairs whose largest step-score gap is the hedged step"} <= failed
