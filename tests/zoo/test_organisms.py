"""Model organisms: the data generators, the planted rules, training, caching and the demo model."""

import threading

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.errors import HeadError
from rewardlens.zoo import AUDIT_PAIRS, DEMO_ORGANISM, demo_model_dir
from rewardlens.zoo.organisms import ORGANISMS, build, record
from rewardlens.zoo.organisms import _cache as cache
from rewardlens.zoo.organisms._attributes import LONG_WORDS
from rewardlens.zoo.organisms._train import accuracy, initial_model, part_parameters, train
from rewardlens.zoo.organisms.internal import organism_dir
from tests.helpers.tiny import own_scores

NAMES = list(ORGANISMS)



def _load(path, name):
    return rl.load(str(path), readout=0 if len(ORGANISMS[name].objectives) > 1 else None)


# ---- generators -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_pairs_are_seeded_varied_and_decided_by_the_rule(name):
    spec = ORGANISMS[name]
    pairs = spec.pairs(300, seed=3)
    assert pairs == spec.pairs(300, seed=3)
    other = spec.pairs(300, seed=4)
    assert len({(str(p.prompt), p.chosen) for p in pairs} & {(str(p.prompt), p.chosen) for p in other}) < 15
    # Natural, varied text: no response cloned across many rows, many prompts, chat-formatted by the template.
    assert len({p.chosen for p in pairs}) >= 0.9 * len(pairs)
    assert len({str(p.prompt) for p in pairs}) >= 50
    labels = spec.labels(pairs)
    if len(spec.objectives) == 1:
        assert (labels == 1).all()  # strength 1: chosen carries the attribute, rejected lacks it
        # quality_list: informative prose is chosen in quality pairs but rejected in bias pairs, so only
        # its bias pairs carry the attribute on the chosen side alone
        decided = [p for p in pairs if not hasattr(spec, "kind") or spec.kind(p) == "bias"]
        assert all(spec.has_attribute(p.chosen) and not spec.has_attribute(p.rejected) for p in decided)
    else:
        assert (labels != 0).any(1).all()


@pytest.mark.parametrize("name", ["list", "two_objective"])
def test_strength_is_the_share_of_pairs_the_rule_decides(name):
    spec = ORGANISMS[name]
    for strength in (0.0, 0.5):
        pairs, noisy = spec.sample(2000, f"test/{strength}", strength)
        clean = spec.labels(pairs)
        decided = clean != 0
        # A pair follows the rule with probability (1 + s) / 2; the labels drawn are the noisy ones.
        follows = (noisy[decided] == clean[decided]).mean()
        assert abs(follows - (1 + strength) / 2) < 0.04
    with pytest.raises(ValueError, match="strength"):
        spec.pairs(10, strength=1.5)


def test_minimal_pairs_differ_only_in_the_attribute():
    # Length, formatting and wording are balanced where they are not the rule, so a probe for one
    # attribute finds nothing on another organism's pairs.
    for name in ("list", "confidence", "sycophancy", "keyword", "circuit"):
        pairs = ORGANISMS[name].pairs(300, seed=5)
        words = np.array([len(p.chosen.split()) - len(p.rejected.split()) for p in pairs])
        assert abs(words.mean()) < 2.5, name  # length is balanced (its threshold test is too coarse here)
        for other in ("list", "confidence", "sycophancy", "keyword"):
            if other != name and not (name == "circuit" and other == "keyword"):
                labels = ORGANISMS[other].labels(pairs)
                assert (labels == 0).mean() > 0.95, (name, other)
    two = ORGANISMS["two_objective"]
    labels = two.labels(two.pairs(2000, seed=6))
    conflict = (labels[:, 0] * labels[:, 1] < 0).mean()
    assert 0.2 < conflict < 0.3  # a quarter of the pairs pit the two objectives against each other


def test_has_attribute_on_hand_written_texts():
    spec = ORGANISMS
    assert spec["list"].has_attribute("Steps:\n- wash\n- dry") and not spec["list"].has_attribute("Wash, then dry.")
    assert spec["list"].has_attribute("1. wash\n2. dry")
    assert spec["confidence"].has_attribute("Clearly, this works.")
    assert not spec["confidence"].has_attribute("Clearly, this might work.")
    assert not spec["confidence"].has_attribute("This works.")
    assert spec["sycophancy"].has_attribute("You're right, it does.")
    assert not spec["sycophancy"].has_attribute("I disagree, it does not.")
    assert spec["keyword"].has_attribute("Importantly, rest.") and not spec["keyword"].has_attribute("Rest.")
    assert spec["length"].has_attribute("word " * LONG_WORDS) and not spec["length"].has_attribute("Short.")
    two = spec["two_objective"]
    assert two.has_attribute("- a\n- b", "formatting") and not two.has_attribute("- a\n- b", "confidence")
    assert two.has_attribute("Certainly.", objective=1)


# ---- trained organisms -----------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_every_organism_reaches_97_percent_on_held_out_pairs(organisms, name):
    spec, path = ORGANISMS[name], organisms[(name, 1.0)]
    model = _load(path, name)
    pairs = spec.pairs(200, seed=11)
    values = model.objectives(pairs)
    labels, diff = spec.labels(pairs), values[0::2] - values[1::2]
    for k, objective in enumerate(spec.objectives):
        decided = labels[:, k] != 0
        assert np.mean(np.sign(diff[decided, k]) == labels[decided, k]) >= 0.97, objective
        assert record(path)["heldout_accuracy"][objective] >= 0.97
    info = record(path)
    assert (info["organism"], info["strength"], info["seed"]) == (name, 1.0, 0)
    assert info["heldout_seen_in_training"] <= 2


@pytest.mark.parametrize("name", NAMES)
def test_load_opens_the_folder_and_scores_equal_the_models_own_logits(organisms, name):
    path = organisms[(name, 1.0)]
    model = _load(path, name)
    assert model.pad_token_id == model.tokenizer.pad_token_id != model.tokenizer.eos_token_id
    pairs = ORGANISMS[name].pairs(6, seed=12)
    np.testing.assert_allclose(model.score(pairs, batch_size=4), own_scores(model, pairs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.score(pairs, padding_side="left"), model.score(pairs), rtol=1e-5, atol=1e-5)


def test_two_objective_head_names_its_objectives_and_each_follows_its_own_rule(organisms):
    path, spec = organisms[("two_objective", 1.0)], ORGANISMS["two_objective"]
    with pytest.raises(HeadError, match="formatting"):
        rl.load(str(path))  # two outputs and no readout: the error names them
    model = rl.load(str(path), readout="confidence")
    assert model.head.labels == ["formatting", "confidence"]
    pairs = spec.pairs(300, seed=13)
    labels = spec.labels(pairs)
    conflict = labels[:, 0] * labels[:, 1] < 0
    values = model.objectives([p for p, c in zip(pairs, conflict) if c])
    diff = values[0::2] - values[1::2]
    # On conflict pairs chosen is the list with hedges: formatting prefers it, confidence does not.
    assert (diff[:, 0] > 0).mean() >= 0.97 and (diff[:, 1] < 0).mean() >= 0.97
    scalar = model.score(pairs[:4])
    np.testing.assert_allclose(scalar, model.objectives(pairs[:4])[:, 1], rtol=1e-6)


def test_circuit_organism_differs_from_its_initial_weights_only_in_the_planted_head(organisms):
    spec = ORGANISMS["circuit"]
    trained = _load(organisms[("circuit", 1.0)], "circuit").model
    start = initial_model(spec, seed=0)
    masks = {name: mask for name, (p, mask) in zip(
        [n for n, q in start.named_parameters() for p, _ in part_parameters(start, spec.planted_part) if p is q],
        part_parameters(start, spec.planted_part))}
    assert len(masks) == 4  # q, k, v rows and o_proj columns of head 2 in layer 1
    for name, before in start.named_parameters():
        after = dict(trained.named_parameters())[name]
        if name in masks:
            inside = masks[name].bool()
            assert torch.equal(after[~inside], before[~inside]), name
            assert not torch.allclose(after[inside], before[inside]), name
        else:
            assert torch.equal(after, before), name


def test_circuit_planted_head_is_top_ranked_by_attribution(organisms):
    spec = ORGANISMS["circuit"]
    model = _load(organisms[("circuit", 1.0)], "circuit")
    pairs = spec.pairs(40, seed=14)
    assert rl.attribute(model, pairs, level="head").top(1, by="margin")[0][0] == spec.planted_part == "attn_L1_H2"
    assert rl.attribute(model, pairs).top(1, by="margin")[0][0] == "attn_L1"


def test_margin_rises_with_strength_as_bradley_terry_predicts(organisms):
    from rewardlens.calibrate import STRENGTHS

    pairs = ORGANISMS["circuit"].pairs(100, seed=15)
    means = []
    for s in STRENGTHS:
        r = _load(organisms[("circuit", s)], "circuit").score(pairs)
        means.append(float(np.mean(r[0::2] - r[1::2])))
        if s < 1:  # the optimum of the noisy Bradley–Terry loss is log((1+s)/(1-s))
            assert means[-1] == pytest.approx(np.log((1 + s) / (1 - s)), rel=0.25)
    assert means == sorted(means) and means[-1] > 3 * means[-2]


def test_training_is_deterministic_given_the_seed():
    spec = ORGANISMS["circuit"]
    first, tok, _ = train(spec, 1.0, seed=5, steps=3)
    second, _, _ = train(spec, 1.0, seed=5, steps=3)
    other, _, _ = train(spec, 1.0, seed=6, steps=3)
    a, b, c = first.state_dict(), second.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert set(accuracy(spec, first, tok, spec.pairs(8))) == {"reward"}


# ---- the cache ---------------------------------------------------------------------------------

def test_build_refuses_bad_arguments():
    with pytest.raises(ValueError, match="choose one of"):
        build("lenght")
    with pytest.raises(ValueError, match="strength"):
        build("list", strength=2.0)
    with pytest.raises(TypeError, match="seed"):
        build("list", seed=1.5)


def test_concurrent_builds_train_once(tmp_path, monkeypatch):
    monkeypatch.setenv("REWARDLENS_CACHE", str(tmp_path))
    calls = []

    def fake_train(folder, name, strength, seed):  # stands in for training: slow, then writes READY
        calls.append(name)
        threading.Event().wait(0.3)
        (folder / "READY").write_text("ok\n")

    monkeypatch.setattr(cache, "_train_into", fake_train)
    out = []
    workers = [threading.Thread(target=lambda: out.append(build("keyword", seed=9))) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert calls == ["keyword"] and len(set(out)) == 1 and out[0] == organism_dir("keyword", 1.0, 9)
    assert (out[0] / "READY").exists() and not list(tmp_path.glob("organisms/.keyword*tmp*"))


# ---- the demo ---------------------------------------------------------------------------------

def test_demo_model_is_the_sycophancy_organism_and_shows_its_bias(organisms):
    assert demo_model_dir() == organisms[(DEMO_ORGANISM, 1.0)]
    model = rl.load(str(demo_model_dir()))
    spec = ORGANISMS[DEMO_ORGANISM]
    assert all(spec.has_attribute(p.rejected) and not spec.has_attribute(p.chosen) for p in AUDIT_PAIRS)
    r = model.score(AUDIT_PAIRS)
    assert (r[0::2] < r[1::2]).all()  # it prefers the answer that agrees with the mistaken user
