"""Closure of the attribution graph on every architecture the closure tests cover (decoders and the post-norm
encoders), for transcoders and neurons.

Three independent computations meet: the targets' values from the model's own forward (Hugging Face's
logit; the transcoder's `pre` on the MLP input a plain hook captures), the edges from batched backward
passes, and the constants from a forward with every source at zero. And the reward's edges from last-layer
neurons at the read token must be rewardlens' exact neuron decomposition (nothing lies between them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.modeling_utils import AttentionInterface

import rewardlens as rl
from rewardlens.graphs import graph
from rewardlens.model import Part
from rewardlens.sae.internal import mlp_module
from tests.graphs.conftest import SHORT, random_transcoders
from tests.helpers.tiny import ARCHS, configs, own_scores, perturb_, unpadded

MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
FULL = ("llama", "gpt2", "bert")
TOL = 1e-5


V3 = "deberta-v3"
"""DeBERTa-v2 in the layout of the released DeBERTa-v3 reward models: relative embeddings layer-normed (a norm
whose input is a parameter table, without a batch dimension) and projected through the content query and key
projections (`share_att_key`), relative positions in log buckets."""


@pytest.fixture(scope="module", params=[*ARCHS, V3])
def model(request, tiny_root, tmp_path_factory, tokenizer):
    if request.param != V3:
        return rl.load(str(tiny_root[request.param]))
    cls, config = configs(tokenizer)["deberta-v2"]
    config.update(dict(share_att_key=True, norm_rel_ebd="layer_norm", position_buckets=16))
    torch.manual_seed(0)
    hf = cls.from_config(config).eval()
    perturb_(hf, 0)
    path = tmp_path_factory.mktemp(V3)
    hf.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return rl.load(str(path))


def _side_closes(g) -> None:
    value, const = g.nodes.value[g.rows], g.nodes.constant[g.rows]
    scale = np.abs(g.adjacency).astype(np.float64).sum(1) + np.abs(const)
    np.testing.assert_array_less(np.abs(value - g.adjacency.astype(np.float64).sum(1) - const), TOL * scale + 1e-7)


def _mlp_inputs(model, pair) -> list[dict[int, torch.Tensor]]:
    """Each side's MLP inputs per layer, by plain hooks on one unpadded forward (the yardstick)."""
    out = []
    for kwargs in unpadded(model, pair):
        seen: dict[int, torch.Tensor] = {}

        def keep(layer: int, args: tuple, kwargs: dict, seen: dict = seen) -> None:
            seen[layer] = (args[0] if args else kwargs["hidden_states"])[0].detach()

        hooks = [mlp_module(model, layer).register_forward_pre_hook(
            lambda _m, a, k, layer=layer, keep=keep: keep(layer, a, k), with_kwargs=True)
            for layer in range(model.n_layers)]
        with torch.no_grad():
            model.model(**kwargs)
        for h in hooks:
            h.remove()
        out.append(seen)
    return out


def test_transcoder_graph_closes_on_reward_and_every_feature(model):
    tcs = random_transcoders(model)
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    interface = AttentionInterface.get_interface
    pg = graph(model, SHORT, tcs, max_nodes=40, batch_size=16)[0]
    theirs = own_scores(model, [SHORT])
    inputs = _mlp_inputs(model, SHORT)
    for g, score, x in ((pg.chosen, theirs[0], inputs[0]), (pg.rejected, theirs[1], inputs[1])):
        assert g.reward == pytest.approx(score, rel=1e-5, abs=1e-6)
        _side_closes(g)
        feats = np.nonzero(g.nodes.kind == 0)[0]
        assert len(feats) == min(40, len(feats)) and g.dropped > 0  # the cap holds and the rest still closes
        for i in feats:
            layer, pos, f = int(g.nodes.layer[i]), int(g.nodes.position[i]), int(g.nodes.feature[i])
            pre = float(tcs[layer].pre(x[layer][pos].float())[f].detach())
            assert g.nodes.value[i] == pytest.approx(pre, rel=1e-5, abs=1e-6)
            assert g.nodes.names[i] == Part.transcoder(layer, f).at(pos).name
    m = pg.margin
    assert m.nodes.value[m.rows[-1]] == pytest.approx(theirs[0] - theirs[1], rel=1e-5, abs=1e-6)
    # relative to each target's Σ|incoming| + |constant| (as the decomposition's closure is), floored at 1e-3 of
    # the largest: a prompt feature's two sides cancel to rounding
    assert m.closure_gap <= TOL
    # nothing of the model changed: weights, hooks, the attention interface
    assert all(torch.equal(before[k], v) for k, v in model.model.state_dict().items())
    assert all(p.requires_grad and p.grad is None for p in model.model.parameters())  # the frozen run's detached
    # weights were swapped back: the user's parameters are the same objects, still trainable, with no grad written
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.model.modules())
    assert AttentionInterface.get_interface is interface


def test_neuron_graph_is_exact_and_matches_the_neuron_decomposition(model):
    if model.arch.name in MOE:
        with pytest.raises(rl.errors.UsageError, match="dense MLPs"):
            graph(model, SHORT, basis="neurons")
        return
    _neuron_graph_is_exact(model, full=model.arch.name == FULL[0])  # the others capped (the gated MLP in full)


@pytest.mark.slow  # every neuron a node: ~60 s on gpt2, ~20 s on bert
@pytest.mark.parametrize("arch", FULL[1:])
def test_every_neuron_of_a_plain_and_a_post_norm_mlp_is_an_exact_node(tiny_root, arch):
    _neuron_graph_is_exact(rl.load(str(tiny_root[arch])), full=True)


def _neuron_graph_is_exact(model, full: bool) -> None:
    """Neuron graphs close on the model's own reward; `full` (every neuron a node: no error node) also equals
    rewardlens' exact neuron decomposition at the last layer."""
    pg = graph(model, SHORT, basis="neurons", max_nodes=10**6 if full else 48, batch_size=64 if full else 16)[0]
    theirs = own_scores(model, [SHORT])
    for g, score in ((pg.chosen, theirs[0]), (pg.rejected, theirs[1])):
        assert g.reward == pytest.approx(score, rel=1e-5, abs=1e-6)
        assert ((g.nodes.kind == 1).any() and g.dropped > 0) != full  # exact: no error node unless capped
        _side_closes(g)
    assert pg.margin.closure_gap <= TOL
    if not full:
        return
    att = rl.attribute(model, SHORT, level="neuron", layers=[model.n_layers - 1])
    last, at = model.n_layers - 1, pg.chosen.read_at
    names = {n: i for i, n in enumerate(pg.chosen.nodes.names)}
    for j, name in enumerate(att.names):
        part = Part.parse(name)
        if part.layer == last and part.neuron is not None:
            i = names.get(part.at(at).name)
            edge = 0.0 if i is None else float(pg.chosen.adjacency[-1, i])
            assert edge == pytest.approx(float(att.values[0, j]), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("basis", ["neurons", "transcoders"])
def test_several_pairs_in_one_call_equal_one_pair_a_call(tiny_root, basis):
    """Each side gets a fresh basis (its active set, its frozen gates): a call over pairs of different lengths
    gives every pair the graph it gets alone (a basis reused from pair 0 once broke on the next pair's length)."""
    model = rl.load(str(tiny_root["llama"]))
    pairs = [SHORT, rl.Pair("Name a colour of the sky on a clear day, please.", "Blue, mostly.", "Green.")]
    tcs = random_transcoders(model) if basis == "transcoders" else None
    together = graph(model, pairs, tcs, basis=basis, max_nodes=64)
    for pair, got in zip(pairs, together):
        (alone,) = graph(model, pair, tcs, basis=basis, max_nodes=64)
        for side in ("chosen", "rejected", "margin"):
            a, b = getattr(got, side), getattr(alone, side)
            assert a.nodes.names == b.nodes.names
            np.testing.assert_allclose(a.adjacency, b.adjacency, rtol=1e-5, atol=1e-6)
