"""The receiver mechanism: a node reads x + δ while the residual stream stays x, on every tiny architecture."""

import pytest
import torch

import rewardlens as rl
from rewardlens.causal._receivers import Receiver, clean_points, receiving, receiving_all, wiring
from rewardlens.errors import ArchitectureError
from rewardlens.model.internal import Point, capture, collate, discover, eval_mode
from tests.helpers.tiny import ARCHS

FUSED = {"gpt2", "gpt_neox", "phi3"}  # one qkv projection


def test_receiver_names_round_trip_and_bad_names_are_refused():
    for name in ("reward", "attn_L3", "mlp_L2", "attn_L3_H1", "attn_L3_H1_q", "attn_L0_H0_k", "attn_L1_H2_v"):
        assert Receiver.parse(name).name == name
    assert Receiver.parse("attn_L3_H1_q") == Receiver("head", 3, 1, "q")
    assert Receiver.parse("attn_L3_H1").inputs == ("q", "k", "v")
    for bad in ("embed", "attn_L1_bias", "mlp_L1_N3", "mlp_L1_q", "attn_L1_q", "attn_L1_H0_x", "head"):
        with pytest.raises(ValueError, match="is not a receiver"):
            Receiver.parse(bad)
    with pytest.raises(ValueError, match="input= is 'q', 'k' or 'v'"):
        Receiver("attn", 1, input="q")


def _run(model, batch, hooks_ctx, points, *, after=False):
    """(captured points, the HF model's own rewards [B]); `after`: capture what `hooks_ctx`'s hooks left
    (they are registered first, and forward hooks run in registration order), else what they were given."""
    kwargs = model.batch_kwargs(batch)
    with torch.no_grad(), eval_mode(model.model):
        with (hooks_ctx if after else capture(points, model.device)) as a, \
                (capture(points, model.device) if after else hooks_ctx) as b:
            out = model.model(**kwargs)
    score = getattr(out, "score", None)  # ArmoRM returns its gated total as `score`
    return (b if after else a), (out.logits[:, 0] if score is None else score.reshape(-1))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_stream_is_unchanged_but_through_the_receiver(tiny_root, pairs, arch):
    """Run with the receiver reading x + δ; then a clean run whose only change is the receiver's
    write set to what it wrote in the first run must give the same reward: δ reached nothing else."""
    model = rl.load(str(tiny_root[arch]))
    seqs = model.encode(pairs[:2])[0]
    batch = collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
    b, t = batch.input_ids.shape
    every = torch.arange(t).expand(b, t)
    delta = torch.randn(b, t, model.d_model, generator=torch.Generator().manual_seed(0))
    # OLMo-2's q_norm spans every head (refused: tests/causal/test_path_patch.py)
    names = ["attn_L1", "mlp_L1", "mlp_L0"] + ([] if arch in FUSED | {"olmo2"} else ["attn_L1_H2_q"])
    assert (arch in FUSED) == (model.arch.attn_q is None)
    for name in names:
        receiver = Receiver.parse(name)
        wire = wiring(model, receiver)
        clean, base = _run(model, batch, torch.no_grad(), clean_points(wire, every))
        write = {"w": Point(wire.cancel, "out", every)}
        got, patched = _run(model, batch, receiving(model, wire, delta, clean), write)
        # the receiver's input did change (one head's query moves the reward least)
        assert (patched - base).abs().max() > (1e-6 if receiver.head is not None else 1e-4), name

        def force(_m, _a, out, new=got["w"]):  # the write f(x + δ) as the cancel hook was given it
            value = new.to(out[0].dtype if isinstance(out, tuple) else out.dtype)
            return (value, *out[1:]) if isinstance(out, tuple) else value
        handle = wire.cancel.register_forward_hook(force)
        try:
            _, replayed = _run(model, batch, torch.no_grad(), {})
        finally:
            handle.remove()
        torch.testing.assert_close(replayed, patched, atol=1e-5, rtol=1e-4)


def test_a_head_receiver_changes_only_its_own_columns(tiny_root, pairs):
    model = rl.load(str(tiny_root["bert"]))
    seqs = model.encode(pairs[:1])[0]
    batch = collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
    b, t = batch.input_ids.shape
    every = torch.arange(t).expand(b, t)
    wire = wiring(model, Receiver.parse("attn_L1_H2_k"))
    clean, _ = _run(model, batch, torch.no_grad(), clean_points(wire, every))
    delta = torch.randn(b, t, model.d_model, generator=torch.Generator().manual_seed(1))
    points = {key: Point(module, "out", every) for key, module, _ in wire.frozen}
    got, _ = _run(model, batch, receiving(model, wire, delta, clean), points, after=True)
    size = model.d_model // model.n_heads
    for key in ("q", "v"):
        torch.testing.assert_close(got[key], clean[key])
    changed = (got["k"] - clean["k"]).abs().amax((0, 1))
    assert changed[2 * size: 3 * size].min() > 0 and changed[: 2 * size].max() == 0 and changed[3 * size:].max() == 0


def test_receiving_needs_the_clean_outputs_it_freezes(tiny_root):
    model = rl.load(str(tiny_root["gpt_neox"]))
    with pytest.raises(ValueError, match=r"needs the clean outputs \['mlp'\]"):
        with receiving(model, Receiver.parse("attn_L1"), torch.zeros(1, 1, model.d_model)):
            pass
    with pytest.raises(ArchitectureError, match="fused qkv"):
        wiring(model, Receiver.parse("attn_L1_H0"))


def test_discovery_finds_separate_qkv_projections(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    found = discover(model.model)
    assert (found.attn_q, found.attn_k, found.attn_v) == ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    assert discover(rl.load(str(tiny_root["gpt2"])).model).attn_q is None  # gpt2's c_attn is fused


@pytest.mark.parametrize("arch,names", [
    ("llama", ["attn_L1_H0_q", "attn_L1_H2_q", "attn_L1_H3_q"]),   # grouped k/v: each head's query only
    ("qwen3", ["attn_L1_H1_q", "attn_L1_H2_q"]),                    # d_head 24 != d/H, per-head q/k norms
    ("gemma2", ["attn_L1_H0_q", "attn_L1_H3_q"]),
    ("bert", ["attn_L1_H0", "attn_L1_H1_q", "attn_L1_H2_k", "attn_L1_H3_v"]),  # the projections read the layer input
])
def test_several_heads_of_one_layer_read_their_own_inputs_in_one_forward(tiny_root, pairs, arch, names):
    """Each head's columns of each projection equal that head's own single-receiver run (`receiving`,
    which freezes the rest at clean values); every other column stays clean."""
    model = rl.load(str(tiny_root[arch]))
    seqs = model.encode(pairs[:2])[0]
    batch = collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
    b, t = batch.input_ids.shape
    every = torch.arange(t).expand(b, t)
    gen = torch.Generator().manual_seed(2)
    deltas = {Receiver.parse(n): torch.randn(b, t, model.d_model, generator=gen) for n in names}
    wire = wiring(model, next(iter(deltas)))
    points = {key: Point(module, "out", every) for key, module, _ in wire.frozen}
    clean, base = _run(model, batch, torch.no_grad(), points)
    merged, reward = _run(model, batch, receiving_all(model, deltas), points, after=True)
    assert (reward - base).abs().max() > 1e-6
    expect = {key: value.clone() for key, value in clean.items()}
    for r, delta in deltas.items():
        own = wiring(model, r)
        alone, _ = _run(model, batch, receiving(model, own, delta, clean), points, after=True)
        for key, _, keep in own.frozen:
            if keep is not None:
                expect[key][..., keep] = alone[key][..., keep]
    for key in expect:
        torch.testing.assert_close(merged[key], expect[key], atol=1e-5, rtol=1e-4)
        assert key in {x for r in deltas for x in r.inputs} or torch.equal(merged[key], clean[key])


def test_receiving_all_refuses_what_it_cannot_merge(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    zero = torch.zeros(1, 1, model.d_model)
    with pytest.raises(ValueError, match="both read layer 1's attention input"):
        with receiving_all(model, {Receiver.parse("attn_L1"): zero, Receiver.parse("attn_L1_H0_q"): zero}):
            pass
    with pytest.raises(ArchitectureError, match="grouped-query"):
        with receiving_all(model, {Receiver.parse("attn_L1_H0_k"): zero}):
            pass
    bert = rl.load(str(tiny_root["bert"]))
    with pytest.raises(ValueError, match="head 1's q input is named by another receiver"):
        with receiving_all(bert, {Receiver.parse("attn_L1_H1"): zero, Receiver.parse("attn_L1_H1_q"): zero}):
            pass
    with pytest.raises(ArchitectureError, match="fused qkv"):
        with receiving_all(rl.load(str(tiny_root["gpt2"])), {Receiver.parse("attn_L1_H0_q"): zero}):
            pass
    with pytest.raises(ArchitectureError, match="parallel layout"):
        with receiving_all(rl.load(str(tiny_root["gpt_neox"])), {Receiver.parse("mlp_L1"): zero}):
            pass
