"""A DPO reward's parts are read along the centred row `e_y − ē` (ē the mean LM row under the next-token
distribution), so they rank by what moves a probability: a write that raises every logit alike moves
none, and reads 0, where the raw row `e_y` gave it a value cancelled only by the frozen log-sum-exp.

Yardsticks: the Hugging Face models' own log-softmax (the reward, unchanged by a common shift of every
LM row), the entropy of each read's next-token distribution (the per-read constant), and the parts of
the same policy without the shift.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import rewardlens as rl
from tests.model.test_rm_kinds import build, conversations, generation_start, logits, own_dpo, template_ids

PAIRS = [rl.Pair("What is 2+3?", "It is 5.", "The answer is six, I think."),
         rl.Pair("Name a colour.", "Blue, like the sky.", "Red.")]
BETA = 0.1


@pytest.fixture(scope="module")
def tok():
    from rewardlens.zoo import build_tokenizer

    return build_tokenizer()


def _shifted(policy: torch.nn.Module, norm: float) -> torch.nn.Module:
    """`policy` with one vector added to every LM-head row: every logit moves by the same amount at each
    position, so no probability (and no DPO reward) changes."""
    out = copy.deepcopy(policy)
    shift = torch.randn(policy.config.hidden_size, generator=torch.Generator().manual_seed(0))
    out.lm_head.weight = torch.nn.Parameter(policy.lm_head.weight.detach() + norm * shift / shift.norm())
    return out


def test_a_common_logit_shift_moves_no_part_and_parts_rank_on_the_margins_scale(tok):
    policy, reference = build(tok, "llama", "lm", seed=0), build(tok, "llama", "lm", seed=1)
    assert policy.lm_head.weight is not policy.get_input_embeddings().weight  # untied: the shift moves the head only
    shifted = _shifted(policy, 50.0)
    own = own_dpo(tok, policy, reference, PAIRS, BETA)
    np.testing.assert_allclose(own_dpo(tok, shifted, reference, PAIRS, BETA), own, atol=1e-4)
    plain = rl.attribute(rl.model.wrap_dpo(policy, reference, tok, beta=BETA), PAIRS)
    att = rl.attribute(rl.model.wrap_dpo(shifted, reference, tok, beta=BETA), PAIRS)
    for a in (plain, att):
        np.testing.assert_allclose(a.values.sum(1) + a.constant, own, atol=1e-4)  # parts + constant = reward
    np.testing.assert_allclose(att.values, plain.values, atol=1e-4)
    np.testing.assert_allclose(att.constant, plain.constant, atol=1e-4)
    margins = np.abs(own[0::2] - own[1::2])
    name, top = att.top(1)[0]
    assert top <= 2 * margins.max(), (name, top, margins)  # raw rows: attn_L1 +34.6 on margins of 0.13, 0.17


def test_each_reads_constant_is_minus_beta_times_its_entropy(tok):
    """With the reference decomposed on its own (no offset) and an LM head without bias, a read's constant
    is `−β H(p)`, the entropy of the policy's next-token distribution at that read."""
    policy, reference = build(tok, "llama", "lm", seed=0), build(tok, "llama", "lm", seed=1)
    rm = rl.model.wrap_dpo(policy, reference, tok, beta=BETA, reference_term="separate")
    steps = rl.attribute(rm, PAIRS).steps
    assert steps is not None
    for i, conv in enumerate(conversations(PAIRS)):
        ids, start = template_ids(tok, conv)[0], generation_start(tok, conv)
        logp = torch.log_softmax(logits(policy, ids), -1)[start - 1:len(ids) - 1]
        entropy = -(logp.exp() * logp).sum(-1).numpy()
        np.testing.assert_allclose(steps.of(i)["constant"], -BETA * entropy, atol=1e-5)
