"""The audit's token attribution: the pairs the report shows (largest |margin|, at most TOKEN_PAIRS),
equal to `rewardlens.tokens` on those pairs, stored once, and not recomputed on a resumed run."""

import importlib

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Plan, audit
from rewardlens.audit.internal import TOKEN_PAIRS
from rewardlens.data import margin
from rewardlens.zoo import DEMO_PAIRS

PLAN = Plan(chunk_size=8, probes=False, concepts=False, divergence=False)


def _many(n):
    return [rl.Pair(f"({i}) {p.prompt}", p.chosen, p.rejected + f" {i}", id=f"p{i}")
            for i, p in ((i, DEMO_PAIRS[i % len(DEMO_PAIRS)]) for i in range(n))]


def test_the_audit_attributes_the_tokens_of_the_pairs_with_the_largest_margins(tiny_root, tmp_path, monkeypatch):
    model = rl.load(str(tiny_root["llama"]))
    pairs = _many(TOKEN_PAIRS + 3)
    res = audit(model, pairs, store=tmp_path / "results.sqlite", plan=PLAN)
    m = margin(res.lens.reward)
    want = [int(i) for i in np.argsort(-np.abs(m), kind="stable")[:TOKEN_PAIRS]]
    assert res.token_pairs == want and len(res.tokens.rows) == 2 * TOKEN_PAIRS
    direct = rl.tokens(model, [pairs[i] for i in want], heads=False, approx=False)
    assert res.tokens.tokens == direct.tokens
    for got, exp in zip(res.tokens.values, direct.values):
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.tokens.reward, res.lens.reward.reshape(-1, 2)[want].ravel(), rtol=1e-5, atol=1e-5)

    def boom(*args, **kwargs):
        raise AssertionError("token attribution was computed again")

    monkeypatch.setattr(importlib.import_module("rewardlens.audit._whole"), "tokens", boom)
    again = audit(model, pairs, store=tmp_path / "results.sqlite", plan=PLAN)
    assert again.token_pairs == want
    # the token roles come back from the store, so the report's content view needs no rerun
    assert again.tokens.roles is not None and len(again.tokens.roles) == len(direct.roles)
    for got, exp in zip(again.tokens.roles, direct.roles):
        np.testing.assert_array_equal(got, exp)


def test_without_tokens_the_audit_says_so(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    res = audit(model, _many(3), plan=Plan(probes=False, concepts=False, divergence=False, tokens=False))
    assert res.tokens is None and res.token_pairs == []


@pytest.mark.parametrize("n", [1, 2])
def test_a_few_pairs_are_all_attributed(tiny_root, n):
    model = rl.load(str(tiny_root["gpt2"]))
    res = audit(model, _many(n), plan=PLAN)
    assert sorted(res.token_pairs) == list(range(n))
