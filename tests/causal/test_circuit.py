"""Circuits by edge ablation: every edge is the clean run, no edge the fully corrupted read token, and
head-level circuits (each head's q/k/v inputs their own nodes, all in one forward) equal a naive loop."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rewardlens as rl
from rewardlens.errors import ArchitectureError, CircuitError


@pytest.fixture(scope="module")
def found(tiny_root, pairs):
    return rl.circuit(rl.load(str(tiny_root["llama"])), pairs, method="eap", top=3)


def test_every_edge_is_the_clean_run_and_no_edge_the_corrupted_read(found):
    every = found.sizes.index(len(found.ranked))
    np.testing.assert_allclose(found.margins[every], found.clean, atol=1e-5)
    # read-position noising with no edge kept: every node reads the rejected side's writes at the read
    # token, so the reward read there is the rejected side's own: margin 0 (by hand)
    np.testing.assert_allclose(found.empty, 0.0, atol=1e-5)
    assert found.sizes[0] == 0 and len(found.kept) == 3 and found.kept == found.ranked[:3]
    frame = found.to_frame()
    assert frame["share"].iloc[every] == pytest.approx(1.0, abs=1e-5)
    assert '"share"' in found.to_json()


def test_smallest_and_bad_input(found, tiny_root, pairs):
    assert len(found.smallest(0.99)) <= len(found.ranked)
    with pytest.raises(CircuitError, match="no evaluated circuit reaches a share of 2"):
        found.smallest(2.0)
    model = rl.load(str(tiny_root["llama"]))
    with pytest.raises(CircuitError, match="at least one edge"):
        rl.circuit(model, pairs, method="eap", top=0)
    with pytest.raises(ValueError, match="exactly one of top="):
        rl.circuit(model, pairs, method="eap")
    scored = rl.edges(model, pairs)
    with pytest.raises(CircuitError, match="scored on parts"):
        rl.circuit(model, pairs, edges=dataclasses.replace(scored, upstream=scored.upstream[::-1]), top=2)
    with pytest.raises(ArchitectureError, match="normalises the attention output after the heads"):
        rl.circuit(rl.load(str(tiny_root["gemma2"])), pairs, level="head", top=2)
    with pytest.raises(ArchitectureError, match="fused qkv"):
        rl.circuit(rl.load(str(tiny_root["phi3"])), pairs, method="eap", level="head", top=2)


# --- the naive loop: plain Hugging Face forwards, hooks written here, iterated to a fixed point ---

def _writes(hf, rec: dict, layers, n_heads: int, read):
    """Hooks recording what every part writes at positions `read` (an index or a slice): embed, each head
    z_h W_O[:, h]ᵀ, each MLP."""
    def embed(_m, args):
        rec["embed"] = args[0][0, read].detach().float()

    def heads(layer):
        def hook(m, args):
            z = args[0][0, read].detach().float()
            size = z.shape[-1] // n_heads
            for h in range(n_heads):
                cols = slice(h * size, (h + 1) * size)
                rec[f"attn_L{layer}_H{h}"] = z[..., cols] @ m.weight[:, cols].T.float()
        return hook

    def mlp(layer):
        def hook(_m, _a, out):
            rec[f"mlp_L{layer}"] = out[0, read].detach().float()
        return hook
    hs = [layers[0].register_forward_pre_hook(embed)]
    for i, layer in enumerate(layers):
        hs += [layer.self_attn.o_proj.register_forward_pre_hook(heads(i)), layer.mlp.register_forward_hook(mlp(i))]
    return hs


def _depth(part: str) -> int:
    """Half-layer a part writes at (embed 0, layer l's heads 2l+1, its MLP 2l+2)."""
    return 0 if part == "embed" else 2 * int(part.split("_L")[1].split("_")[0]) + (1 if part.startswith("attn") else 2)


def _naive_margin(hf, ids_c, ids_r, kept: set, nodes: set, n_heads: int, every: bool) -> float:
    """Margin of one pair under noising (at the read token, or at `every` position of a token-aligned
    pair) with only `kept` edges carrying the chosen run: each node reads its input + Σ_{u→node ∉ kept}
    (w'_u − w_u), with w_u from the previous pass (2L+2 passes reach the fixed point); a head's q/k/v
    columns are projected by hand from the input norm of x + δ."""
    layers, n = hf.model.layers, len(hf.model.layers)
    parts = ["embed"] + [p for i in range(n) for p in [f"attn_L{i}_H{h}" for h in range(n_heads)] + [f"mlp_L{i}"]]
    bad: dict = {}
    with torch.no_grad():
        hs = _writes(hf, bad, layers, n_heads, slice(None) if every else ids_r.shape[1] - 1)
        r_rej = float(hf(input_ids=ids_r).logits[0, 0])
        for h in hs:
            h.remove()
        read, cur = slice(None) if every else ids_c.shape[1] - 1, {}
        hs = _writes(hf, cur, layers, n_heads, read)
        hf(input_ids=ids_c)
        for h in hs:
            h.remove()

        def shifted(x, node, depth):
            d = sum((bad[p] - cur[p] for p in parts if _depth(p) <= depth and (p, node) not in kept),
                    torch.zeros(x.shape[-1]))
            x = x.clone()
            x[0, read] += d.to(x.dtype)
            return x

        def qkv(layer, i, name, x_in):
            def hook(m, _a, out):
                out, size = out.clone(), m.weight.shape[0] // n_heads
                for h in range(n_heads):
                    node = next((f"attn_L{i}_H{h}{s}" for s in ("", f"_{name}") if f"attn_L{i}_H{h}{s}" in nodes), None)
                    if node is not None:
                        cols = slice(h * size, (h + 1) * size)
                        normed = layer.input_layernorm(shifted(x_in["x"], node, 2 * i))
                        out[..., cols] = F.linear(normed, m.weight, m.bias)[..., cols]
                return out
            return hook

        for _ in range(2 * n + 2):  # each pass fixes one more half-layer of the writes
            fresh: dict = {}
            hs = _writes(hf, fresh, layers, n_heads, read)
            for i, layer in enumerate(layers):
                x_in: dict = {}
                hs.append(layer.register_forward_pre_hook(lambda _m, a, x_in=x_in: x_in.update(x=a[0])))
                hs += [getattr(layer.self_attn, f"{x}_proj").register_forward_hook(qkv(layer, i, x, x_in))
                       for x in ("q", "k", "v")]
                hs.append(layer.post_attention_layernorm.register_forward_pre_hook(
                    lambda _m, a, i=i: (shifted(a[0], f"mlp_L{i}", 2 * i + 1),)))
            hs.append(hf.model.norm.register_forward_pre_hook(lambda _m, a: (shifted(a[0], "reward", 2 * n),)))
            reward = float(hf(input_ids=ids_c).logits[0, 0])
            for h in hs:
                h.remove()
            cur = fresh
    return reward - r_rej


def _shuffled(scored, seed: int):
    """The same edges ranked at random, so that small circuits hold head nodes of every kind."""
    noise = np.random.default_rng(seed).standard_normal(scored.score.shape)
    return dataclasses.replace(scored, score=np.where(np.isnan(scored.score), np.nan, noise))


def _check_against_naive(model, pairs, c, names, sizes, every=False):
    seqs = model.encode(pairs)[0]
    nodes = {d for _, d in names}
    for size in sizes:
        kept = {(u, d) for u, d, _ in c.ranked[:size]}
        naive = [_naive_margin(model.model, torch.tensor([seqs[2 * i].ids]), torch.tensor([seqs[2 * i + 1].ids]),
                               kept, nodes, model.n_heads, every) for i in range(len(pairs))]
        np.testing.assert_allclose(c.margins[c.sizes.index(size)], naive, atol=2e-5, rtol=1e-4)
    every = c.sizes.index(len(c.ranked))
    np.testing.assert_allclose(c.margins[every], c.clean, atol=1e-5)  # every edge kept: the clean margin
    np.testing.assert_allclose(c.empty, 0.0, atol=1e-5)  # none: the reward reads the rejected side's writes


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_head_level_circuits_equal_a_naive_hooked_loop(tiny_root, pairs, arch):
    model = rl.load(str(tiny_root[arch]))
    scored = rl.edges(model, pairs, method="eap", level="head")
    c = rl.circuit(model, pairs, edges=_shuffled(scored, 0), top=6, sizes=[6, 20])
    # grouped k/v (2 key/value heads for 4 query heads): a head's query input is its own node
    assert c.level == "head" and {d for d in scored.downstream if "_H" in d} == {
        f"attn_L{i}_H{h}_q" for i in range(2) for h in range(4)}
    assert sum("_H" in d for _, d, _ in c.ranked[:20]) >= 5  # the circuits do run through head nodes
    _check_against_naive(model, pairs, c, scored.names, (6, 20))


def test_head_level_circuits_with_key_and_value_inputs_equal_the_naive_loop(organisms):
    """The two_step organism has a key/value head per query head: whole-head nodes (q, k and v
    together) and, with qkv=True, each input its own node; its sides are token-aligned, so every
    position is noised (at the read token alone its heads' inputs barely change)."""
    from rewardlens.zoo.organisms import ORGANISMS

    model = rl.load(str(organisms[("two_step", 1.0)]))
    pairs = ORGANISMS["two_step"].pairs(2, seed=5)
    for qkv in (False, True):
        scored = rl.edges(model, pairs, method="eap", level="head", qkv=qkv, positions="all")
        assert ("attn_L1_H2_k" in scored.downstream) == qkv and ("attn_L1_H2" in scored.downstream) != qkv
        c = rl.circuit(model, pairs, edges=_shuffled(scored, 1), top=4, sizes=[4, 12], positions="all")
        heads = {d for _, d, _ in c.ranked[:12] if "_H" in d}
        assert len(heads) >= 3 and (not qkv or {d[-2:] for d in heads} >= {"_k", "_v"}), heads
        _check_against_naive(model, pairs, c, scored.names, (4, 12), every=True)


def test_a_spec_is_the_keywords_it_stands_for(found, tiny_root, pairs):
    """`spec=` only builds what the keywords build: the same circuit, and its provenance says how it ran."""
    from rewardlens.causal import PatchSpec

    model = rl.load(str(tiny_root["llama"]))
    got = rl.circuit(model, pairs, method="eap", top=3, spec=PatchSpec(mode="noising"))
    np.testing.assert_array_equal(got.margins, found.margins)
    assert got.kept == found.kept and got.provenance.engine == "edge_ablation"
    with pytest.raises(ValueError, match="either as spec= or as keywords"):
        rl.circuit(model, pairs, method="eap", top=3, spec=PatchSpec(), mode="denoising")
