"""Mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE), decomposed exactly: the sparse block is
the MLP sublayer, and level='neuron' splits it into experts (router weight × expert output, plus the
shared expert). Checked against the model's own forward, a by-hand recomputation of the router and
the experts from their raw weights, and the naive patching loop.

The three are also in tests/helpers/tiny.py's ARCHS (every architecture-parametrized test runs them);
this file's models have routers scaled up, so that different inputs choose different experts."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rewardlens as rl
from rewardlens.causal import patch
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import ArchitectureError
from rewardlens.model import Part
from rewardlens.model.internal import Point, capture, discover, get_module
from tests.helpers.naive import naive_patch
from tests.helpers.tiny import MOE, build_moe, own_scores, unpadded

CLOSURE = 1e-4
# Plain texts end in different tokens (every templated pair ends in the same one), so routing differs by row.
TEXTS = ["Paris is the capital of France.", "Boil the egg for nine minutes", "12 times 12 is 144",
         "I am quite sure about that", "Eggs."]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("moe")
    return {name: build_moe(name, tokenizer, root) for name in MOE}


@pytest.fixture(scope="module", params=MOE)
def model(request, folders):
    return rl.load(str(folders[request.param]))


def _closes(att, reward) -> None:
    np.testing.assert_allclose(att.reward, reward, rtol=1e-5, atol=1e-5 * np.abs(reward).max())
    scale = np.abs(att.values).sum(1) + np.abs(att.constant)
    assert (np.abs(att.residual_error) <= CLOSURE * scale).all(), att.residual_error


def test_scores_equal_the_models_own_logits_any_batch_and_padding(model, pairs):
    theirs = own_scores(model, pairs)
    assert np.abs(theirs).max() > 1e-3, "degenerate test model: rewards are ~0"
    for batch_size, side in ((1, "right"), (4, "left"), (6, "right")):
        ours = model.score(pairs, batch_size=batch_size, padding_side=side)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * np.abs(theirs).max())


@pytest.mark.parametrize("level", ["sublayer", "head", "neuron"])
def test_parts_plus_constant_equal_the_models_own_reward(model, pairs, level):
    _closes(rl.attribute(model, pairs, level=level, batch_size=4), own_scores(model, pairs))


def test_experts_and_heads_sum_to_their_sublayer(model, pairs):
    sub = rl.attribute(model, pairs, level="sublayer")
    col = {n: i for i, n in enumerate(sub.names)}
    shared = model.arch.name == "qwen2_moe"
    fine = rl.attribute(model, pairs, level="neuron")
    for layer in range(model.n_layers):
        names = [n for n in fine.names if n.startswith(f"mlp_L{layer}_")]
        assert names == [f"mlp_L{layer}_E{e}" for e in range(4)] + ([f"mlp_L{layer}_shared"] if shared else [])
        members = [fine.names.index(n) for n in names]
        np.testing.assert_allclose(fine.values[:, members].sum(1), sub.values[:, col[f"mlp_L{layer}"]],
                                   rtol=1e-4, atol=1e-6)
    heads = rl.attribute(model, pairs, level="head")
    members = [i for i, n in enumerate(heads.names) if n.startswith("attn_L1_")]
    np.testing.assert_allclose(heads.values[:, members].sum(1), sub.values[:, col["attn_L1"]], rtol=1e-4, atol=1e-6)


@torch.no_grad()
def _by_hand(model, seq) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """One unpadded forward of the HF model: each layer's expert writes at the read token computed by
    hand from the raw weights ({layer: [E (+1), d]}), and the read-out vector u = w ⊙ γ / rms(final)."""
    hf, config = model.model, model.model.config
    blocks = [layer.mlp for layer in get_module(hf, "model.layers")]
    t = len(seq["input_ids"][0]) - 1
    points = {f"in{i}": Point(b, "in", torch.tensor([t])) for i, b in enumerate(blocks)}
    points["final"] = Point(hf.model.norm, "in", torch.tensor([t]))
    with capture(points, torch.device("cpu")) as got:
        hf(**seq)
    writes = {}
    for i, block in enumerate(blocks):
        h = got[f"in{i}"][0]
        probs = F.softmax(h @ block.gate.weight.T, dim=-1)
        top, idx = probs.topk(config.num_experts_per_tok)
        if getattr(config, "norm_topk_prob", True):  # Mixtral always renormalises
            top = top / top.sum()
        experts = block.experts
        rows = torch.zeros(experts.num_experts, h.shape[0])
        for g, e in zip(top, idx):
            gate, up = (experts.gate_up_proj[e] @ h).chunk(2)
            rows[e] = g * (experts.down_proj[e] @ (F.silu(gate) * up))
        if hasattr(block, "shared_expert"):
            s = block.shared_expert
            out = s.down_proj(F.silu(s.gate_proj(h)) * s.up_proj(h))
            rows = torch.cat([rows, (torch.sigmoid(block.shared_expert_gate.weight @ h) * out)[None]])
        writes[i] = rows
    x = got["final"][0]
    norm = hf.model.norm
    u = hf.score.weight[0] * norm.weight / torch.sqrt(x.pow(2).mean() + norm.variance_epsilon)
    return writes, u


def test_expert_values_equal_the_router_and_experts_recomputed_by_hand(model):
    """Each expert's value is u · g_e(x)·E_e(x), with the router's top-k and every expert's MLP
    recomputed from the raw 3-D weights (unchosen experts exactly 0), and u from the final norm."""
    att = rl.attribute(model, TEXTS, level="neuron", batch_size=3)
    _closes(att, own_scores(model, TEXTS))
    chosen = set()
    for row, seq in enumerate(unpadded(model, TEXTS)):
        writes, u = _by_hand(model, seq)
        for layer, rows in writes.items():
            cols = [i for i, n in enumerate(att.names) if n.startswith(f"mlp_L{layer}_")]
            want = (rows @ u).numpy()
            np.testing.assert_allclose(att.values[row, cols], want, rtol=1e-4, atol=1e-6)
            picked = np.flatnonzero(rows[:4].abs().sum(-1).numpy())
            assert len(picked) == 2 and (np.delete(att.values[row, cols[:4]], picked) == 0).all()
            chosen.add((layer, tuple(picked)))
    assert len(chosen) > 2, f"every input routed alike {chosen}: the check would be weak"


def test_patching_at_sublayer_and_head_level_equals_the_naive_loop(model, pairs):
    for level in ("sublayer", "head"):
        got = patch(model, pairs, level=level, batch_size=2)
        want_c, want_r = naive_patch(model, pairs, level=level)
        np.testing.assert_allclose(got.patched_chosen, want_c, atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(got.patched_rejected, want_r, atol=2e-5, rtol=1e-5)
        assert np.abs(got.effect).max() > 1e-5


def test_both_lenses_end_at_the_reward(model, pairs):
    ln = rl.lens(model, pairs)
    np.testing.assert_allclose(ln.linear[:, -1], ln.reward, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ln.normed[:, -1], ln.reward, rtol=1e-4, atol=1e-6)


def test_model_is_never_modified(model, pairs):
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    model.model.train()  # the user's flag must survive the experts' calls (run in eval: Mixtral jitters)
    try:
        rl.attribute(model, pairs[:1], level="neuron")
        assert model.model.training and all(m.training for m in model.model.modules())
    finally:
        model.model.eval()
    assert all(torch.equal(before[k], v) for k, v in model.model.state_dict().items())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.model.modules())


def test_the_sum_is_proved_on_the_spot(folders, pairs):
    """A block whose output holds more than its experts' sum (here: a hook adds a vector) still closes at
    sublayer level (its output is the write), but the expert split is refused, naming the gap."""
    model = rl.load(str(folders["qwen3_moe"]))
    block = model.layer_module(1, "mlp")
    handle = block.register_forward_hook(lambda m, a, out: out + 0.5)
    try:
        _closes(rl.attribute(model, pairs, level="sublayer"), own_scores(model, pairs))
        with pytest.raises(ArchitectureError, match="do not add up to the block's output at layer 1"):
            rl.attribute(model, pairs, level="neuron")
    finally:
        handle.remove()


def test_discovery_names_the_whole_block_not_the_shared_expert(folders, tokenizer, pairs):
    """Unregistered, Qwen2-MoE is discovered with the sparse block as its MLP (its shared expert's
    down_proj runs on flattened [n·T, d] states and writes only part of the sum)."""
    model = rl.load(str(folders["qwen2_moe"]))
    arch = discover(model.model)
    assert arch.mlp_out == "mlp" and arch.attn_out == "self_attn.o_proj"
    wrapped = rl.wrap(model.model, tokenizer, arch=arch)
    _closes(rl.attribute(wrapped, pairs, level="neuron"), own_scores(wrapped, pairs))


def test_dense_layers_beside_sparse_ones(tmp_path, tokenizer, pairs):
    """Qwen2-MoE with a dense layer 0 (mlp_only_layers): sublayers close everywhere, experts split on the
    sparse layer, and a neuron split of the dense block is refused before any forward, by layer."""
    model = rl.load(str(build_moe("qwen2_moe", tokenizer, tmp_path, mlp_only_layers=[0])))
    theirs = own_scores(model, pairs)
    _closes(rl.attribute(model, pairs), theirs)
    att = rl.attribute(model, pairs, level="neuron", layers=[1])
    _closes(att, theirs)
    assert "mlp_L1_shared" in att.names and "mlp_L0" in att.names
    with pytest.raises(ArchitectureError, match="layer 0's mlp output 'mlp' \\(Qwen2MoeMLP\\)"):
        rl.attribute(model, pairs, level="neuron")


def test_part_names_round_trip():
    for name in ("mlp_L1_E3", "mlp_L0_shared", "mlp_L1_E0"):
        part = Part.parse(name)
        assert part.name == name and not part.is_sublayer and part.sublayer == Part.mlp(part.layer)
    assert Part.parse("mlp_L1_E3") == Part.mlp(1, expert=3) and Part.parse("mlp_L2_shared").shared
    for bad in ("attn_L1_E3", "attn_L0_shared", "mlp_L1_E"):
        with pytest.raises(ValueError):
            Part.parse(bad)
    with pytest.raises(ValueError, match="not to a neuron"):  # neurons inside an expert are not parts
        Part.mlp(1, 5, expert=3)


def test_the_command_line_attributes_experts(folders, tmp_path, capsys, pairs):
    pairs_file = save_pairs(pairs[:1], tmp_path / "pairs.jsonl")
    assert main(["attribute", str(folders["mixtral"]), "--pairs", str(pairs_file), "--json", "--level", "neuron"]) == 0
    assert "mlp_L1_E2" in json.dumps(json.loads(capsys.readouterr().out))
