"""Neuron-level patching: attribution patching of every MLP neuron against autograd of the model's own
forward, and exact patching of chosen neurons against one hooked Hugging Face forward per neuron.

The yardsticks here share nothing with the engine but the model's module map: a neuron is column i of the
input of layer l's MLP output projection (`model.arch.mlp_out`), the activation that multiplies W_down[:, i].
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.causal import attribution_patch, patch
from tests.helpers.naive import _forward

CHOSEN = ["mlp_L1_N77", "mlp_L0_N3", "mlp_L1_N0"]


def _down(model, layer: int) -> torch.nn.Module:
    return model.layer_module(layer, model.arch.mlp_out)


@contextlib.contextmanager
def _on_input(module: torch.nn.Module, fn):
    """Replace the module's first input by `fn(input)` (a plain forward pre-hook)."""
    handle = module.register_forward_pre_hook(lambda m, args: (fn(args[0]), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def _reads(model, seqs) -> list[int]:
    return [int(next(iter(model.batches([s], 1)))[1].read_index[0]) for s in seqs]


def _activations(model, seq) -> dict[int, torch.Tensor]:
    """Every layer's neuron activations [T, d_mlp] on one clean forward."""
    out: dict[int, torch.Tensor] = {}
    with contextlib.ExitStack() as stack:
        for layer in range(model.n_layers):
            def keep(x, layer=layer):
                out[layer] = x[0].detach().clone()
                return x
            stack.enter_context(_on_input(_down(model, layer), keep))
        _forward(model, seq)
    return out


def _reward_and_grad(model, seq, layer: int) -> torch.Tensor:
    """∂r/∂a [T, d_mlp] of the model's own output r with respect to layer `layer`'s neuron activations,
    made a leaf (torch.autograd.grad) on an otherwise clean forward."""
    leaf: list[torch.Tensor] = []

    def swap(x):
        leaf.append(x.detach().clone().requires_grad_(True))
        return leaf[0]

    kwargs = {"input_ids": torch.tensor([seq.ids])}
    if seq.type_ids is not None:
        kwargs["token_type_ids"] = torch.tensor([seq.type_ids])
    with torch.enable_grad(), _on_input(_down(model, layer), swap):
        out = model.model(**kwargs)
        score = getattr(out, "score", None)
        reward = score[0] if score is not None else out.logits[0, 0]
        (grad,) = torch.autograd.grad(reward.sum(), leaf[0])
    return grad[0]


CASES = [("llama", "noising"), ("llama", "ablation"), ("gpt2", "noising"), ("gpt2", "ablation"),
         ("gpt_neox", "noising")]
"""(architecture, mode): gated (Llama's SwiGLU) and non-gated MLPs (GPT-2's Conv1D projection; GPT-NeoX's
parallel residual). The tiny encoder's neurons move its reward by less than its fp32 precision."""


@pytest.mark.parametrize(("arch", "mode"), CASES)
def test_neuron_attribution_patching_is_autograd_times_the_delta(tiny_root, pairs, arch, mode):
    """effect_n = clean margin − estimated patched margin = −Σ_sides ∂r/∂a_n · (a_inserted − a_n), the gradient of
    the model's own reward at the clean run: for every neuron of every layer, to float precision."""
    model = rl.load(str(tiny_root[arch]))
    got = attribution_patch(model, pairs, level="neuron", mode=mode)
    assert got.approximate and got.level == "neuron"
    seqs, _ = model.encode(pairs)
    read = _reads(model, seqs)
    acts = [_activations(model, s) for s in seqs]
    want: dict[str, np.ndarray] = {}
    for layer in range(model.n_layers):
        width = acts[0][layer].shape[-1]
        effect = np.zeros((len(pairs), width))
        for i in range(len(pairs)):
            c, r = 2 * i, 2 * i + 1
            jobs = [(c, acts[r][layer][read[r]])] if mode == "noising" else [
                (c, torch.zeros(width)), (r, torch.zeros(width))]
            for t, inserted in jobs:
                delta = inserted - acts[t][layer][read[t]]
                dr = (_reward_and_grad(model, seqs[t], layer)[read[t]] * delta).numpy()
                effect[i] += -dr if t == c else dr  # margin = chosen − rejected; effect = clean − patched
        for n in range(width):
            want[f"mlp_L{layer}_N{n}"] = effect[:, n]
    names = [n for n in got.names if "_N" in n]
    assert names == list(want), "every neuron of every layer, in layer order, named as attribute() names them"
    table = np.stack([want[n] for n in names], 1)
    assert np.abs(table).max() > 1e-4, "every expected effect is zero: the check would be empty"
    # Float precision of the rewards the result holds (an effect is a difference of two fp32 rewards).
    scale = max(1.0, float(np.abs(np.concatenate([got.chosen, got.rejected])).max()))
    np.testing.assert_allclose(got.effect[:, [got.names.index(n) for n in names]], table, rtol=1e-4,
                               atol=1e-6 * scale)


def test_neuron_attribution_patching_of_chosen_neurons_is_the_same_estimate(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    every = attribution_patch(model, pairs, level="neuron")
    chosen = attribution_patch(model, pairs, level="neuron", neurons=CHOSEN)
    assert chosen.names == CHOSEN
    np.testing.assert_allclose(chosen.effect, every.effect[:, [every.names.index(n) for n in CHOSEN]], atol=1e-7)


def _naive_neurons(model, pairs, names: list[str], mode: str, every: bool = False) -> np.ndarray:
    """Patched margins [n, len(names)] by brute force: per (pair, neuron), one unpadded forward of the patched
    side with that neuron's activation at the read token (at every position: `every`, token-aligned pairs)
    replaced by the other side's (noising) or zero."""
    seqs, _ = model.encode(pairs)
    read = _reads(model, seqs)
    acts = [_activations(model, s) for s in seqs]
    clean = np.array([_forward(model, s) for s in seqs])
    margins = np.zeros((len(pairs), len(names)))
    for j, name in enumerate(names):
        layer, n = int(name.split("_L")[1].split("_")[0]), int(name.split("_N")[1])
        for i in range(len(pairs)):
            side = {2 * i: clean[2 * i], 2 * i + 1: clean[2 * i + 1]}
            targets = [(2 * i, 2 * i + 1)] if mode == "noising" else [(2 * i, None), (2 * i + 1, None)]
            for t, s in targets:
                at = slice(None) if every else read[t]
                value = torch.tensor(0.0) if s is None else acts[s][layer][slice(None) if every else read[s], n]

                def put(x, at=at, n=n, value=value):
                    x = x.clone()
                    x[0, at, n] = value.to(x.dtype)
                    return x

                with _on_input(_down(model, layer), put):
                    side[t] = _forward(model, seqs[t])
            margins[i, j] = side[2 * i] - side[2 * i + 1]
    return margins


@pytest.mark.parametrize(("arch", "mode"), CASES)
def test_patching_chosen_neurons_equals_one_hooked_forward_per_neuron(tiny_root, pairs, arch, mode):
    model = rl.load(str(tiny_root[arch]))
    # The three neurons attribution patching ranks first (so the effects are not all tiny), then fixed ones.
    ranked = [n for n, _ in attribution_patch(model, pairs, level="neuron", mode=mode).top(20) if "_N" in n]
    chosen = ranked[:3] + [n for n in CHOSEN if n not in ranked[:3]]
    got = patch(model, pairs, level="neuron", neurons=chosen, mode=mode, batch_size=2)
    assert got.names == chosen and not got.approximate and got.level == "neuron"
    want = _naive_neurons(model, pairs, chosen, mode)
    np.testing.assert_allclose(got.patched_chosen - got.patched_rejected, want, atol=2e-5, rtol=1e-5)
    clean = got.chosen - got.rejected
    assert np.abs(clean[:, None] - want).max() > 1e-5, "every neuron's effect is zero: the check would be empty"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_patching_chosen_neurons_at_every_position_equals_the_hooked_forwards(tiny_root, arch):
    model = rl.load(str(tiny_root[arch]))
    candidates = [rl.Pair("Say a number.", "The number is 7.", "The number is 9."),
                  rl.Pair("Is it hot?", "It is hot.", "It is not."), rl.Pair("Answer.", "Yes", "No!")]
    seqs, _ = model.encode(candidates)
    aligned = [p for i, p in enumerate(candidates) if len(seqs[2 * i].ids) == len(seqs[2 * i + 1].ids)]
    assert len(aligned) >= 2, "the test needs token-aligned pairs"
    ranked = [n for n, _ in attribution_patch(model, aligned, level="neuron", positions="all").top(20) if "_N" in n]
    chosen = ranked[:3] + [n for n in CHOSEN if n not in ranked[:3]]
    got = patch(model, aligned, level="neuron", neurons=chosen, positions="all", batch_size=2)
    want = _naive_neurons(model, aligned, chosen, "noising", every=True)
    np.testing.assert_allclose(got.patched_chosen - got.patched_rejected, want, atol=2e-5, rtol=1e-5)
    assert np.abs((got.chosen - got.rejected)[:, None] - want).max() > 1e-5


def test_a_last_layer_neurons_direct_effect_is_its_total_effect(tiny_root, pairs):
    """Nothing but the final norm reads the last MLP's output, so path-frozen and total patching agree there."""
    model = rl.load(str(tiny_root["llama"]))
    last = [f"mlp_L{model.n_layers - 1}_N{n}" for n in (0, 5, 77)]
    total = patch(model, pairs, level="neuron", neurons=last)
    direct = patch(model, pairs, level="neuron", neurons=last, estimand="direct")
    np.testing.assert_allclose(direct.effect, total.effect, atol=2e-6)
    assert np.abs(total.effect).max() > 1e-5


def test_neuron_sweeps_are_refused_by_name_with_the_fix(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    with pytest.raises(ValueError, match=r"all 256 MLP neurons.*choose neurons=.*attribution patching"):
        patch(model, pairs, level="neuron")
    bad = [
        ("mlp_L1_N3", "non-empty list of neuron names"), ([], "non-empty list"),
        (["attn_L0_H1"], "'attn_L0_H1', which is not one MLP neuron"), (["mlp_L1"], "not one MLP neuron"),
        ([7], "holds 7, which is not"), (["mlp_L2_N0"], "layers 0..1"), (["mlp_L0_N128"], "neurons 0..127"),
        (["mlp_L0_N1", "mlp_L0_N1"], "twice"),
    ]
    for neurons, match in bad:
        with pytest.raises(ValueError, match=match):
            patch(model, pairs, level="neuron", neurons=neurons)
    with pytest.raises(ValueError, match="pass level='neuron' with it"):
        patch(model, pairs, level="head", neurons=["mlp_L0_N1"])
    with pytest.raises(ValueError, match=r"faithfulness patches every part exactly.*patch\(neurons=\.\.\.\)"):
        rl.faithfulness(model, pairs, level="neuron")
    moe = rl.load(str(tiny_root["mixtral"]))
    with pytest.raises(ValueError, match="mixture-of-experts block, which has no neurons"):
        attribution_patch(moe, pairs, level="neuron", neurons=["mlp_L0_N1"])


def test_a_reward_read_at_a_set_of_positions_patches_neurons_too(tokenizer):
    """A DPO reward (read at every response token): zero ablation is linear in a bias-free down projection, so
    the first-order estimates of a layer's neurons sum to its MLP sublayer's (whose output is W_down a), and the
    exact patch of chosen neurons runs on the set-of-reads engine; a last-layer neuron's direct and total
    effects agree."""
    from tests.causal.test_dpo_attribution_patching import BETA, PAIRS
    from tests.model.test_rm_kinds import build

    rm = rl.model.wrap_dpo(build(tokenizer, "llama", "lm", seed=0), build(tokenizer, "llama", "lm", seed=1), tokenizer,
                     beta=BETA)
    with pytest.warns(rl.errors.RewardLensWarning, match="zero ablation at every read"):
        fine = attribution_patch(rm, PAIRS, level="neuron")
    with pytest.warns(rl.errors.RewardLensWarning, match="zero ablation at every read"):
        coarse = attribution_patch(rm, PAIRS)
    for layer in range(rm.n_layers):
        cols = [i for i, n in enumerate(fine.names) if n.startswith(f"mlp_L{layer}_N")]
        np.testing.assert_allclose(fine.effect[:, cols].sum(1), coarse.effect[:, coarse.names.index(f"mlp_L{layer}")],
                                   rtol=1e-4, atol=1e-5)
    last = [f"mlp_L{rm.n_layers - 1}_N{n}" for n in (3, 40)]
    with pytest.warns(rl.errors.RewardLensWarning):
        total = patch(rm, PAIRS, level="neuron", neurons=last)
    with pytest.warns(rl.errors.RewardLensWarning):
        direct = patch(rm, PAIRS, level="neuron", neurons=last, estimand="direct")
    assert total.names == last and np.abs(total.effect).max() > 1e-5
    np.testing.assert_allclose(direct.effect, total.effect, atol=2e-5)


def test_a_neuron_level_trace_serves_both_and_a_coarser_one_is_refused(tiny_root, pairs):
    from rewardlens.causal import trace_pairs

    model = rl.load(str(tiny_root["llama"]))
    traced = trace_pairs(model, pairs, level="neuron", record="noising")
    shared = patch(model, pairs, level="neuron", neurons=CHOSEN, clean=traced.clean)
    np.testing.assert_allclose(shared.effect, patch(model, pairs, level="neuron", neurons=CHOSEN).effect, atol=2e-6)
    estimate = attribution_patch(model, pairs, level="neuron", clean=traced.clean)
    np.testing.assert_allclose(estimate.effect, attribution_patch(model, pairs, level="neuron").effect, atol=1e-6)
    coarse = trace_pairs(model, pairs, level="head").clean
    for run in (patch, attribution_patch):
        with pytest.raises(ValueError, match=r"clean= holds no mlp_act_0 .*trace_pairs\(model, pairs, level='neuron'"):
            run(model, pairs, level="neuron", neurons=CHOSEN, clean=coarse)
