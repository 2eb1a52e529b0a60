"""Divergence against a natural fit made once over more pairs than one call patches (`patch(natural=)`):
chunks patched against the fit of every pair, each from its own trace's held caches, join
(`Patching.joined`) into the numbers of one call over every pair, on every architecture."""

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.causal import Patching, patch, trace_pairs
from rewardlens.causal.internal import NaturalFit, encode_pairs, natural_states
from rewardlens.model import TraceKey
from rewardlens.zoo import DEMO_PAIRS
from tests.helpers.tiny import ARCHS

PAIRS = list(DEMO_PAIRS) * 2  # 8 sequences at least: the natural fit's minimum


@pytest.mark.parametrize("arch", ARCHS)
def test_chunks_against_one_fit_join_into_one_calls_numbers(tiny_root, arch):
    model = rl.load(str(tiny_root[arch]))
    whole = patch(model, PAIRS, level="head", divergence=True)
    fit = NaturalFit(model, natural_states(model, encode_pairs(model, PAIRS), batch_size=8))
    parts = []
    for start in range(0, len(PAIRS), 3):  # chunks of 3 pairs: the last one shorter
        part = PAIRS[start:start + 3]
        traced = trace_pairs(model, part, level="head", record="noising")
        parts.append(patch(model, part, level="head", divergence=True, natural=fit, clean=traced.clean))
    joined = Patching.joined(parts, PAIRS)
    assert joined.pair_ids == whole.pair_ids and joined.names == whole.names
    np.testing.assert_allclose(joined.patched_chosen, whole.patched_chosen, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(joined.chosen, whole.chosen, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(joined.divergence, whole.divergence, rtol=1e-4, atol=1e-5)
    # the chunks' own fits would differ: each chunk alone is not the natural distribution of every pair
    alone = patch(model, PAIRS[:4], level="head", divergence=True)
    assert not np.allclose(alone.divergence, whole.divergence[:4], rtol=1e-3, atol=1e-3)


def test_natural_is_refused_without_divergence_or_beside_a_reference(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    fit = NaturalFit(model, natural_states(model, encode_pairs(model, PAIRS), batch_size=8))
    with pytest.raises(ValueError, match="divergence=True"):
        patch(model, PAIRS[:2], level="head", natural=fit)
    with pytest.raises(ValueError, match="reference="):
        patch(model, PAIRS[:2], level="head", divergence=True, natural=fit, reference=PAIRS)


def test_a_fit_missing_a_layer_is_refused_by_name(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    states = natural_states(model, encode_pairs(model, PAIRS), batch_size=8)
    states.pop(TraceKey.resid(model.n_layers - 1))
    with pytest.raises(ValueError, match=f"layers \\[{model.n_layers - 1}\\] are missing"):
        NaturalFit(model, states)


def test_joined_refuses_parts_of_different_sweeps(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    heads = patch(model, PAIRS[:2], level="head")
    with pytest.raises(ValueError, match="differ in \\['names', 'level'\\]"):
        Patching.joined([heads, patch(model, PAIRS[2:4])], PAIRS[:4])
    with pytest.raises(ValueError, match="hold 2 pairs but 3"):
        Patching.joined([heads], PAIRS[:3])
    with pytest.raises(ValueError, match="at least one"):
        Patching.joined([], [])
