"""A DPO reward's two responses rarely have one length, so no response token of one side maps to one of
the other: `patch` and `attribution_patch` then patch by zero ablation at every read by default (the
audit's rule, `patch_mode`), and attribution patching estimates that ablation as `−Σ_k a_k · ∂r/∂a_k`
over each side's reads.

Yardstick: autograd through the Hugging Face models' own log-softmax, `β Σ_t [log π(y_t) − log π_ref(y_t)]`
over the response tokens, with a zero leaf added to each sublayer's output, in one unpadded forward
per side.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.errors import DataError, RewardLensWarning
from tests.model.test_rm_kinds import build, conversations, generation_start, template_ids

PAIRS = [rl.Pair("What is 2+3?", "It is 5.", "The answer is six, I think."),
         rl.Pair("Name a colour.", "Blue, like the sky.", "Red."),
         rl.Pair("Say hi.", "Hello there, friend!", "Hi.")]
BETA = 0.5


@pytest.fixture(scope="module")
def tok():
    from rewardlens.zoo import build_tokenizer

    return build_tokenizer()


@contextlib.contextmanager
def _leaf(module: torch.nn.Module, where: str, kept: dict[str, torch.Tensor]):
    """Add a zero leaf to `module`'s input ('in', the embeddings a first layer reads) or output, keeping
    the activation ('a') and the leaf ('d')."""

    def touch(x: torch.Tensor) -> torch.Tensor:
        kept["a"], kept["d"] = x.detach().clone(), torch.zeros_like(x, requires_grad=True)
        return x + kept["d"]

    if where == "in":
        handle = module.register_forward_pre_hook(
            lambda m, a, k: ((touch(a[0]), *a[1:]), k) if a else (a, {**k, "hidden_states": touch(k["hidden_states"])}),
            with_kwargs=True)
    else:
        handle = module.register_forward_hook(lambda m, a, o: (touch(o[0]), *o[1:]) if isinstance(o, tuple)
                                              else touch(o))
    try:
        yield
    finally:
        handle.remove()


def _ablation_estimates(tok, rm, policy, reference) -> np.ndarray:
    """[sequences, sites]: `−Σ_t a_t · ∂r/∂a_t` at each response read t of each side, per sublayer site."""
    sites = [(rm.layers[0], "in")] + [(rm.layer_module(layer, path), "out") for layer in range(rm.n_layers)
                                      for path in (rm.arch.attn_out, rm.arch.mlp_out)]
    out = []
    for conv in conversations(PAIRS):
        ids, start = template_ids(tok, conv)[0], generation_start(tok, conv)
        t = torch.arange(start - 1, len(ids) - 1)
        y = torch.tensor(ids)[t + 1]
        with torch.no_grad():
            ref = torch.log_softmax(reference(input_ids=torch.tensor([ids])).logits[0].float(), -1)[t, y].sum()
        row = []
        for module, where in sites:
            kept: dict[str, torch.Tensor] = {}
            with _leaf(module, where, kept), torch.enable_grad():
                logp = torch.log_softmax(policy(input_ids=torch.tensor([ids])).logits[0].float(), -1)[t, y].sum()
                (grad,) = torch.autograd.grad(BETA * (logp - ref), kept["d"])
            row.append(float(-(kept["a"][0, t] * grad[0, t]).sum()))
        out.append(row)
    return np.array(out)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_attribution_patching_takes_dpo_rewards_of_two_lengths(tok, arch):
    policy, reference = build(tok, arch, "lm", seed=0), build(tok, arch, "lm", seed=1)
    rm = rl.model.wrap_dpo(policy, reference, tok, beta=BETA)
    counts = rm.read_counts(PAIRS)
    assert all(a != b for a, b in zip(counts[0::2], counts[1::2]))  # no read-to-read map in any pair
    with pytest.warns(RewardLensWarning, match="zero ablation at every read"):
        got = rl.causal.attribution_patch(rm, PAIRS)
    assert got.mode == "ablation" and got.approximate and np.isfinite(got.effect).all()
    per_side = _ablation_estimates(tok, rm, policy, reference)
    # Ablation patches both sides: the effect is minus the chosen side's change plus the rejected side's.
    np.testing.assert_allclose(got.effect, -(per_side[0::2] - per_side[1::2]), atol=1e-4)
    with pytest.warns(RewardLensWarning, match="zero ablation at every read"):
        exact = rl.patch(rm, PAIRS)
    assert exact.mode == "ablation" and exact.names == got.names
    top = np.argsort(-np.abs(exact.effect).mean(0))[:3]  # the first-order estimate keeps their signs
    np.testing.assert_array_equal(np.sign(got.effect[:, top]), np.sign(exact.effect[:, top]))
    with pytest.raises(DataError, match="different numbers of positions.*mode='ablation'"):
        rl.causal.attribution_patch(rm, PAIRS, mode="noising")  # noising asked for still has no map to patch by

