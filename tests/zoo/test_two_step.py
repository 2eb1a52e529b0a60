"""The two_step organism: a bigram rule planted in two heads in series (docs/organisms.md)."""

import pytest
import torch

import rewardlens as rl
from rewardlens.zoo.organisms import ORGANISMS, ablated
from rewardlens.zoo.organisms._specs import TWO_STEP_PATH
from rewardlens.zoo.organisms._train import _check_frozen, encode, initial_model, organism_tokenizer, part_parameters

DIM = 16  # head dimension of the organisms: hidden 64 over 4 heads


def test_pairs_are_token_aligned_and_differ_only_in_the_order_of_the_two_words():
    spec, tok = ORGANISMS["two_step"], organism_tokenizer()
    first, second = tok.convert_tokens_to_ids(["ĠNotably", "ĠImportantly"])
    for pair in spec.pairs(50, seed=7):
        chosen, rejected = encode(tok, pair)
        assert len(chosen) == len(rejected)  # positions='all' patching needs it
        where = [i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b]
        assert len(where) == 2 and where[1] == where[0] + 1
        assert [chosen[i] for i in where] == [first, second] and [rejected[i] for i in where] == [second, first]
        assert sorted(chosen) == sorted(rejected)  # the same bag of tokens: no one-token cue
    assert spec.has_attribute("Notably Importantly, rest.") and not spec.has_attribute("Importantly Notably, rest.")
    assert spec.planted_part is None and spec.planted_path == TWO_STEP_PATH == ("attn_L0_H1", "attn_L1_H2")
    assert spec.recipe.trainable == TWO_STEP_PATH


def test_part_parameters_of_several_parts_take_each_parameter_once_with_the_union_of_masks():
    model = initial_model(ORGANISMS["two_step"], seed=0)
    attn = model.model.layers[1].self_attn
    got = {id(p): m for p, m in part_parameters(model, ("attn_L1_H0", "attn_L1_H2"))}
    assert len(got) == 4  # q, k, v, o of layer 1, each once
    rows = torch.zeros(64, 64)
    rows[0:DIM] = rows[2 * DIM:3 * DIM] = 1  # heads 0 and 2 write these rows of q/k/v
    assert torch.equal(got[id(attn.q_proj.weight)], rows) and torch.equal(got[id(attn.o_proj.weight)], rows.T)
    whole = dict(part_parameters(model, ("attn_L1_H0", "attn_L1")))  # the sublayer absorbs its head's mask
    assert len(whole) == 4 and all(m is None for m in whole.values())
    mixed = part_parameters(model, ("attn_L0_H1", "mlp_L1"))
    assert len(mixed) == 4 + 3 and sum(m is None for _, m in mixed) == 3  # the MLP's three matrices whole


def test_the_frozen_check_covers_every_planted_part():
    model = initial_model(ORGANISMS["two_step"], seed=0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = part_parameters(model, TWO_STEP_PATH)
    layers = model.model.layers
    with torch.no_grad():
        layers[0].self_attn.q_proj.weight[DIM] += 1.0  # head 1 of layer 0: planted
        layers[1].self_attn.o_proj.weight[:, 2 * DIM] += 1.0  # head 2 of layer 1: planted
    _check_frozen(model, start, trainable, TWO_STEP_PATH)
    with torch.no_grad():
        layers[1].self_attn.v_proj.weight[DIM] += 1.0  # head 1 of layer 1: not planted
    with pytest.raises(AssertionError, match="v_proj"):
        _check_frozen(model, start, trainable, TWO_STEP_PATH)


def test_the_trained_organism_changed_both_planted_heads_and_nothing_else(organisms):
    spec = ORGANISMS["two_step"]
    trained = dict(rl.load(str(organisms[("two_step", 1.0)])).model.named_parameters())
    start = initial_model(spec, seed=0)
    for part in TWO_STEP_PATH:  # each head trained: some entry inside it moved
        assert any(not torch.equal(trained[n][m.bool()], p[m.bool()]) for n, p in start.named_parameters()
                   for q, m in part_parameters(start, part) if q is p and m is not None), part
    masks = {id(p): m for p, m in part_parameters(start, TWO_STEP_PATH)}
    for name, before in start.named_parameters():
        keep = torch.ones_like(before, dtype=torch.bool) if id(before) not in masks else masks[id(before)] == 0
        assert torch.equal(trained[name].detach()[keep], before.detach()[keep]), name


def test_ablated_zeroes_every_part_of_a_tuple():
    model = initial_model(ORGANISMS["two_step"], seed=0)
    cut = ablated(model, TWO_STEP_PATH)
    for layer, head in ((0, 1), (1, 2)):
        o = cut.model.layers[layer].self_attn.o_proj.weight
        assert torch.count_nonzero(o[:, head * DIM:(head + 1) * DIM]) == 0
        assert torch.count_nonzero(o) == 64 * 64 - 64 * DIM
    assert torch.count_nonzero(model.model.layers[0].self_attn.o_proj.weight) == 64 * 64  # the original is kept
