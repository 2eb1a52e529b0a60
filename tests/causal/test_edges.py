"""Edge attribution against true edge patching (`path_patch` per edge) and its exact identities."""

import numpy as np
import pytest
from scipy.stats import spearmanr

import rewardlens as rl
from rewardlens.errors import ArchitectureError


def true_edges(model, pairs, scored):
    """The yardstick: path_patch of every existing edge (sender u, receiver d), one receiver at a time."""
    out = np.full(scored.score.shape, np.nan)
    for j, d in enumerate(scored.downstream):
        ups = [u for i, u in enumerate(scored.upstream) if scored.valid[i, j]]
        if ups:
            pp = rl.path_patch(model, pairs, senders=ups, receivers=[d])
            out[:, [scored.upstream.index(u) for u in ups], j] = pp.effect[:, :, 0]
    return out


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


def test_edges_into_the_reward_are_path_patching_and_the_rest_rank_like_it(llama, pairs):
    scored = rl.edges(llama, pairs)
    true = true_edges(llama, pairs, scored)
    np.testing.assert_allclose(scored.score[:, :, -1], true[:, :, -1], atol=1e-6)  # exact, not estimated
    assert list(scored.approximate) == [d != "reward" for d in scored.downstream]
    est, want = scored.flat().mean(0), true[:, scored.valid].mean(0)
    assert spearmanr(est, want)[0] > 0.85  # measured 0.94 (docs/circuits.md)
    # first order: each estimated edge is within 20 % of the largest true effect of its true value
    np.testing.assert_allclose(est, want, atol=0.2 * np.abs(want).max())
    assert not scored.valid[scored.upstream.index("mlp_L1"), scored.downstream.index("attn_L1")]


def test_eap_ig_with_one_step_is_eap_and_more_steps_move_the_estimate(llama, pairs):
    eap = rl.edges(llama, pairs, level="head")
    one = rl.edges(llama, pairs, method="eap-ig", steps=1, level="head")
    np.testing.assert_array_equal(one.score, eap.score)
    five = rl.edges(llama, pairs, method="eap-ig", steps=5, level="head")
    assert np.nanmax(np.abs(five.score - eap.score)) > 1e-4
    np.testing.assert_array_equal(five.score[:, :, -1], eap.score[:, :, -1])  # the exact column does not move
    # grouped-query attention: a head's own input is its query
    assert "attn_L1_H2_q" in eap.downstream and "attn_L1_H2_k" not in eap.downstream


def test_head_edges_equal_path_patching_to_first_order(llama, pairs):
    scored = rl.edges(llama, pairs, level="head")
    true = true_edges(llama, pairs, scored)
    est, want = scored.flat().mean(0), true[:, scored.valid].mean(0)
    assert spearmanr(est, want)[0] > 0.85  # measured 0.97


def test_bad_input_is_named(llama, tiny_root, pairs):
    with pytest.raises(ValueError, match="method must be 'eap' or 'eap-ig'"):
        rl.edges(llama, pairs, method="acdc")
    with pytest.raises(ValueError, match="steps must be at least 1"):
        rl.edges(llama, pairs, method="eap-ig", steps=0)
    with pytest.raises(ArchitectureError, match="parallel layout"):
        rl.edges(rl.load(str(tiny_root["gpt_neox"])), pairs)
