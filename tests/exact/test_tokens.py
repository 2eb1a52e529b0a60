"""Exact token attribution (`rl.tokens`): closure against the model's own forward on every architecture,
each token's value against a patched value vector, the heads against the decomposition, and the
circuit organism's planted head reading its rule's word."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers as tf

import rewardlens as rl
from rewardlens.errors import ArchitectureError
from rewardlens.exact.internal import readout_vectors
from rewardlens.model import Part, trace
from tests.helpers import tiny
from tests.helpers.tiny import ARCHS, own_scores


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tiny_root):
    return rl.load(str(tiny_root[request.param]))


def _scale(ta: rl.TokenAttribution) -> np.ndarray:
    return np.array([np.abs(v).sum() for v in ta.values]) + np.abs(ta.at_read) + np.abs(ta.constant)


def test_tokens_plus_read_plus_constant_equal_the_models_own_reward(model, pairs):
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    impl = model.model.config._attn_implementation
    interface = tf.modeling_utils.AttentionInterface.get_interface
    ta = rl.tokens(model, pairs, batch_size=4)  # mixed lengths: padded batches
    theirs = own_scores(model, pairs)
    total = np.array([v.sum() for v in ta.values]) + ta.at_read + ta.constant
    assert (np.abs(total - theirs) <= 1e-4 * _scale(ta)).all(), (total, theirs)
    np.testing.assert_allclose(ta.reward, theirs, rtol=1e-5, atol=1e-6)
    assert min(np.abs(v).max() for v in ta.values) > 1e-6, "degenerate: no token contributes"
    # the user's model, its attention switch and transformers' interface are left as they were
    assert model.model.config._attn_implementation == impl
    assert tf.modeling_utils.AttentionInterface.get_interface is interface
    assert all(torch.equal(before[k], v) for k, v in model.model.state_dict().items())
    assert all(p.grad is None for p in model.model.parameters())


def test_each_heads_split_sums_to_its_exact_value_and_the_rest_is_at_read(model, pairs):
    """Against the decomposition, which reads each head from the output projection's input instead
    of from attention rows."""
    ta = rl.tokens(model, pairs, approx=False)
    att = rl.attribute(model, pairs, level="head")
    parts = [Part.parse(n) for n in att.names]
    heads = np.array([[att.values[i, att.names.index(Part.attn(layer, h).name)] for layer in range(model.n_layers)
                       for h in range(model.n_heads)] for i in range(len(ta.rows))])
    ours = np.stack([p.sum(0).ravel() for p in ta.per_head])  # [n, L·H], layer-major like `heads`
    np.testing.assert_allclose(ours, heads, rtol=1e-4, atol=1e-5 * np.abs(heads).max())
    rest = att.values[:, [i for i, p in enumerate(parts) if p.head is None]].sum(1)
    np.testing.assert_allclose(ta.at_read, rest, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ta.constant, att.constant, rtol=1e-5, atol=1e-6)
    for i, s in enumerate(model.encode(pairs)[0]):
        assert ta.token_ids[i] == s.ids and len(ta.values[i]) == len(s.ids) == len(ta.tokens[i])
        # decoders read the last token, encoders the first
        assert ta.read_index[i] == (0 if model.encoder else len(s.ids) - 1)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_padding_side_and_batch_size_change_nothing(tiny_root, pairs, name):
    m = rl.load(str(tiny_root[name]))
    one = rl.tokens(m, pairs, batch_size=1)
    left = rl.tokens(m, pairs, batch_size=6, padding_side="left")
    for a, b in zip(one.per_head, left.per_head):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(one.total_approx, left.total_approx):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    np.testing.assert_array_equal(one.read_index, left.read_index)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_a_tokens_value_is_what_zeroing_its_value_vector_removes_from_the_read_position(tiny_root, pairs, name):
    """Yardstick: the model's own (sdpa) forward with the value vector of source `s` zeroed at layer `l`
    (bias included; the attention weights do not depend on values). The change of layer `l`'s attention
    output at `t*`, read along the frozen read-out `u`, is minus that source's contribution."""
    m = rl.load(str(tiny_root[name]))
    text = [pairs[1]]
    ta = rl.tokens(m, text, approx=False)
    seqs, _ = m.encode(text)
    batch = next(m.batches(seqs[:1], 1))[1]
    tr = trace(m, batch)
    _, coef = m.head_readout(tr.captured)
    _, u_attn, _, _ = readout_vectors(m, tr, coef)
    t_star = int(batch.read_index[0])

    def attn_out_at_read(layer: int, zero: int | None) -> torch.Tensor:
        got = {}
        attn = m.layers[layer].self_attn
        hooks = [attn.o_proj.register_forward_hook(lambda mod, a, o: got.update(out=o[0, t_star].detach()))]
        if zero is not None:
            hooks.append(attn.v_proj.register_forward_hook(
                lambda mod, a, o: o.index_fill(1, torch.tensor([zero]), 0.0)))
        try:
            with torch.no_grad():
                m.model(input_ids=torch.tensor([seqs[0].ids]))
        finally:
            for h in hooks:
                h.remove()
        return got["out"]

    by_layer = ta.per_layer(0)
    checked = 0
    for layer in range(m.n_layers):
        clean = attn_out_at_read(layer, None)
        for s in (0, t_star // 2, t_star):
            removed = float(u_attn[layer][0, 0] @ (clean - attn_out_at_read(layer, s)))
            np.testing.assert_allclose(by_layer[s, layer], removed, rtol=1e-4, atol=1e-6)
            checked += abs(removed) > 1e-5
    assert checked >= 3, "degenerate: the patched sources barely contribute"


def _variant(tok, root, name, **changes):
    cls, config = tiny.configs(tok)[name]
    for k, v in changes.items():
        setattr(config, k, v)
    torch.manual_seed(1)
    model = cls.from_config(config).eval()
    tiny.perturb_(model, 1)
    path = root / f"{name}-variant"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(("name", "changes", "window_layers"), [
    ("mistral", {"sliding_window": 3}, [0, 1]),
    ("gemma2", {"sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"]}, [0]),
])
def test_sliding_windows_and_soft_capping_close_and_see_only_the_window(tokenizer, tmp_path, pairs, name, changes,
                                                                        window_layers):
    m = rl.load(_variant(tokenizer, tmp_path, name, **changes))
    ta = rl.tokens(m, pairs, batch_size=3)
    theirs = own_scores(m, pairs)
    total = np.array([v.sum() for v in ta.values]) + ta.at_read + ta.constant
    assert (np.abs(total - theirs) <= 1e-4 * _scale(ta)).all()
    for i in range(len(ta.rows)):
        t_star, layers = int(ta.read_index[i]), ta.per_layer(i)
        assert np.all(layers[: t_star - 2, window_layers] == 0), "a source outside the window contributed"
        full = [x for x in range(m.n_layers) if x not in window_layers]
        assert not full or np.abs(layers[: t_star - 2, full]).max() > 0


def test_total_approx_is_the_slope_of_moving_an_embedding_to_the_baseline(tiny_root, pairs):
    """Yardsticks on a float64 copy of the model's own forward (its logits, not rewardlens' head): the
    autograd slope `∂r/∂e_s · e_s` (tight), and central finite differences of moving one token's
    embedding towards the zero baseline, `−d/dε r(e_s − ε e_s)` (loose: Llama's RMSNorm computes in
    fp32 even in a float64 model, so the forward is only smooth to ~1e-7)."""
    m = rl.load(str(tiny_root["llama"]))
    ta = rl.tokens(m, [pairs[0]])
    ids = torch.tensor([m.encode([pairs[0]])[0][0].ids])
    ref = copy.deepcopy(m.model).double()
    emb = ref.get_input_embeddings()

    def run(rewrite) -> torch.Tensor:
        handle = emb.register_forward_hook(lambda mod, a, out: rewrite(out))
        try:
            return ref(input_ids=ids).logits[0, 0]
        finally:
            handle.remove()

    kept = {}

    def probe(out: torch.Tensor) -> torch.Tensor:
        kept["delta"], kept["embed"] = torch.zeros_like(out, requires_grad=True), out.detach()
        return out + kept["delta"]

    (grad,) = torch.autograd.grad(run(probe), kept["delta"])
    slope = (grad * kept["embed"]).sum(-1)[0].numpy()
    np.testing.assert_allclose(ta.total_approx[0], slope, rtol=1e-4, atol=1e-6)

    def shrink(s: int, eps: float):
        def rewrite(out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            out[0, s] *= 1 - eps
            return out
        return rewrite

    eps, checked = 1e-2, 0
    for s in range(0, ids.shape[1], 2):
        with torch.no_grad():
            fd = -float(run(shrink(s, eps)) - run(shrink(s, -eps))) / (2 * eps)
        assert abs(ta.total_approx[0][s] - fd) <= 5e-3 * abs(fd) + 2e-5, (s, ta.total_approx[0][s], fd)
        checked += abs(fd) > 1e-3
    assert checked >= 3


def test_views_pair_tables_top_and_frame(tiny_root, pairs):
    m = rl.load(str(tiny_root["gpt2"]))
    ta = rl.tokens(m, pairs)
    chosen, rejected = ta.pair(1)
    assert list(chosen["token"]) == ta.tokens[2] and list(rejected["token"]) == ta.tokens[3]
    assert chosen["is_read"].sum() == 1 and int(chosen.index[chosen["is_read"]][0]) == ta.read_index[2]
    top = ta.top(2, k=4)
    assert [abs(v) for _, _, v in top] == sorted((abs(v) for v in ta.values[2]), reverse=True)[:4]
    assert all(ta.tokens[2][p] == t and ta.values[2][p] == v for p, t, v in top)
    frame = ta.to_frame()
    assert len(frame) == sum(len(v) for v in ta.values) and list(frame.columns[:4]) == ["row", "position", "token",
                                                                                      "value"]
    np.testing.assert_allclose(frame.groupby("row", sort=False)["value"].sum().to_numpy(),
                               [v.sum() for v in ta.values])
    agree = ta.agreement(k=3)
    assert list(agree["row"]) == ta.rows and agree["topk_overlap"].between(0, 1).all()
    with pytest.raises(IndexError):
        ta.pair(len(pairs))
    ta.plot(0)
    light = rl.tokens(m, pairs, heads=False, approx=False)
    assert light.per_head is None and light.total_approx is None
    for a, b, full in zip(light.by_layer, ta.by_layer, ta.per_head):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(full.sum(-1), b, rtol=1e-12, atol=1e-15)


def test_refuses_when_something_sits_between_the_kernel_and_the_output_projection(tiny_root, pairs):
    """A gated attention (output scaled before o_proj) is not a plain head concatenation: the heads'
    exact values no longer equal their attention rows' mix, and the closure check says so."""
    m = rl.load(str(tiny_root["llama"]))
    rl.tokens(m, pairs[:1], approx=False)  # proves the map first, unhooked
    o_proj = m.layers[1].self_attn.o_proj
    handle = o_proj.register_forward_pre_hook(lambda mod, a: (a[0] * 1.5,))
    try:
        with pytest.raises(ArchitectureError, match="not a plain head concatenation"):
            rl.tokens(m, pairs[:1], approx=False)
    finally:
        handle.remove()


def test_an_error_inside_the_watched_forward_restores_transformers_interface(tiny_root, pairs):
    m = rl.load(str(tiny_root["qwen2"]))
    original = tf.modeling_utils.AttentionInterface.get_interface

    def fail_while_watched(mod, args):
        if tf.modeling_utils.AttentionInterface.get_interface is not original:
            raise RuntimeError("boom inside the watched forward")

    handle = m.layers[0].self_attn.o_proj.register_forward_pre_hook(fail_while_watched)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            rl.tokens(m, pairs[:1], approx=False)
    finally:
        handle.remove()
    assert tf.modeling_utils.AttentionInterface.get_interface is original
    rl.tokens(m, pairs[:1], approx=False)  # and the next call works


def test_circuit_organisms_planted_head_reads_the_rules_word():
    from rewardlens.zoo.organisms import ORGANISMS, build

    spec = ORGANISMS["circuit"]
    layer, head = (lambda p: (p.layer, p.head))(Part.parse(spec.planted_part))
    m = rl.load(str(build("circuit", strength=1.0)))
    pairs = spec.pairs(n=6, seed=3, strength=1.0)
    ta = rl.tokens(m, pairs, approx=False)
    for i in range(0, len(ta.rows), 2):  # chosen sides carry the word
        planted = ta.head(i, layer, head)
        assert ta.tokens[i][int(np.argmax(np.abs(planted)))].strip().lower() == "notably"
        assert ta.top(i, 1)[0][1].strip().lower() == "notably"
    for i in range(1, len(ta.rows), 2):  # rejected sides do not have it
        assert "notably" not in "".join(ta.tokens[i]).lower()
