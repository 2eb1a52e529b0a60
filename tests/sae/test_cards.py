"""Feature cards: contexts against a brute-force pass over the corpus, token activations against Hugging Face's
own hidden states, streaming against one batch, chosen-vs-rejected and correlations against hand computation."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

import rewardlens as rl
from rewardlens.errors import DataError
from rewardlens.sae import SAEConfig, TopKSAE, attribute_features, feature_report, text_axes
from rewardlens.stats import bootstrap_ci
from rewardlens.zoo import DEMO_PAIRS
from tests.helpers import tiny

SMALL = SAEConfig(expansion_factor=4, k=8)
WINDOW = 4


@pytest.fixture(scope="module")
def llama(tiny_root):
    return rl.load(str(tiny_root["llama"]))


@pytest.fixture(scope="module")
def corpus():
    return list(DEMO_PAIRS[:4]) + list(tiny.PAIRS)


@pytest.fixture(scope="module")
def sae(llama):
    return TopKSAE(llama.d_model, SMALL, seed=6)


@pytest.fixture(scope="module")
def att(llama, sae, corpus):
    return attribute_features(llama, sae, corpus, layer=0)


def _hidden(llama, ids):
    """Hugging Face's own residual after layer 0 at every token [T, d]: the yardstick, not rewardlens' hooks."""
    with torch.no_grad():
        return llama.model.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[1][0]


@pytest.fixture(scope="module")
def brute(llama, sae, corpus):
    """Every token's dense code [T, n_latents] of every corpus sequence, all held at once (fine at this size)."""
    seqs, _ = llama.encode(corpus)
    with torch.no_grad():
        return [(s.ids, sae.codes(_hidden(llama, s.ids)).numpy()) for s in seqs]


def _brute_contexts(brute, f, n):
    """The `n` strongest distinct windows of feature `f` by sorting every (activation, seq, pos) of the corpus;
    a decoder's first token is not read. A window is its token ids and the firing token's place in them."""
    hits = sorted(((float(codes[p, f]), i, p) for i, (ids, codes) in enumerate(brute) for p in range(1, len(ids))),
                  key=lambda t: -t[0])
    out, seen = [], set()
    for value, i, p in hits:
        ids = brute[i][0]
        window = (tuple(ids[max(0, p - WINDOW):p + 3]), p - max(0, p - WINDOW))
        if value > 0 and window not in seen and len(out) < n:
            seen.add(window)
            out.append((value, window))
    return out


def _same_rho(got, a, b):
    """`got` is scipy's Spearman ρ of `a` and `b`, or NaN where one of them is constant."""
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        assert math.isnan(got)
    else:
        assert got == pytest.approx(spearmanr(a, b).statistic, abs=1e-6)


def test_top_contexts_are_the_brute_force_strongest_windows(llama, sae, att, corpus, brute):
    rep = feature_report(llama, sae, att, corpus, top=5, n_contexts=3, window=WINDOW)
    assert len(rep.cards) == 5
    for card in rep.cards:
        want = _brute_contexts(brute, card.feature, 3)
        got = [(c.activation, (tuple(brute[c.input][0][c.position - c.peak:c.position - c.peak + len(c.tokens)]),
                               c.peak)) for c in card.contexts]
        assert [w for _, w in got] == [w for _, w in want], card.feature
        np.testing.assert_allclose([v for v, _ in got], [v for v, _ in want], rtol=1e-4, atol=1e-6)


def test_token_activations_are_the_saes_code_of_the_hooked_residual_at_each_token(llama, sae, att, corpus, brute):
    rep = feature_report(llama, sae, att, corpus, top=5, n_contexts=3, window=WINDOW)
    checked = 0
    for card in rep.cards:
        for c in card.contexts:
            ids, codes = brute[c.input]
            start = c.position - c.peak
            assert c.tokens == tuple(llama.tokenizer.decode([i]) for i in ids[start:start + len(c.tokens)])
            assert c.values[c.peak] == pytest.approx(c.activation)
            for k, v in enumerate(c.values):
                if start + k == 0:  # the decoder's first token (an attention sink) is not read
                    assert math.isnan(v)
                else:
                    assert v == pytest.approx(float(codes[start + k, card.feature]), rel=1e-4, abs=1e-6)
                    checked += 1
    assert checked > 20


def test_streaming_in_small_batches_equals_one_batch(llama, sae, att, corpus):
    one = feature_report(llama, sae, att, corpus, top=5, n_contexts=3, window=WINDOW, batch_size=len(corpus) * 2)
    small = feature_report(llama, sae, att, corpus, top=5, n_contexts=3, window=WINDOW, batch_size=1)
    for a, b in zip(one.cards, small.cards):
        assert [(c.tokens, c.peak) for c in a.contexts] == [(c.tokens, c.peak) for c in b.contexts]
        for x, y in zip(a.contexts, b.contexts):
            np.testing.assert_allclose(x.values, y.values, rtol=1e-4, atol=1e-6)
            # (input, position) may differ only between copies of one window (a prompt shared by a pair's sides)
        assert a.frequency == pytest.approx(b.frequency)


def test_chosen_rejected_write_and_correlations_equal_hand_computation(llama, sae, att, corpus, brute):
    seqs, _ = llama.encode(corpus)
    length = np.array([len(s.ids) for s in seqs], dtype=float)
    per_pair = np.arange(len(corpus), dtype=float) ** 2
    axes = {"length": length, "order": per_pair}
    rep = feature_report(llama, sae, att, corpus, top=4, n_contexts=2, window=WINDOW, axes=axes)
    assert rep.cards.axes == ("length", "order")
    for card in rep.cards:
        f = card.feature
        read = np.array([codes[-1, f] for _, codes in brute], dtype=np.float64)  # the read token is the last
        chosen, rejected = read[0::2], read[1::2]
        assert card.chosen == pytest.approx(chosen.mean(), rel=1e-4, abs=1e-7)
        assert card.rejected == pytest.approx(rejected.mean(), rel=1e-4, abs=1e-7)
        assert card.difference == pytest.approx((chosen - rejected).mean(), rel=1e-4, abs=1e-7)
        lo, hi = bootstrap_ci(chosen - rejected)
        assert card.difference_ci == pytest.approx((lo, hi), rel=1e-3, abs=1e-6)
        col = list(att.features).index(f)
        on = att.activations[:, col] > 0
        assert card.write == pytest.approx(float(np.mean(att.values[on, col] / att.activations[on, col])), rel=1e-5)
        peak = np.array([codes[1:, f].max() for _, codes in brute], dtype=np.float64)  # first token not read
        _same_rho(card.correlations["length"], peak, length)
        _same_rho(card.correlations["order"], peak[0::2] - peak[1::2], per_pair)
    assert any(np.isfinite(c.correlations["length"]) for c in rep.cards)


def test_frame_json_plot_and_effects(llama, sae, att, corpus):
    rep = feature_report(llama, sae, att, corpus, top=3, n_contexts=2, window=WINDOW,
                         axes=text_axes(llama, corpus, paris=lambda t: "Paris" in t))
    frame = rep.cards.to_frame()
    assert frame["feature"].tolist() == rep.features.tolist() and "rho_paris" in frame
    assert frame["top_context"].tolist() == [c.contexts[0].text for c in rep.cards]
    f = int(rep.features[1])
    filled = rep.cards.with_effects({f: -0.25})
    assert filled.card(f).effect == -0.25 and [c.effect for c in rep.cards] == [None] * 3
    data = json.loads(filled.to_json())
    assert [c["effect"] for c in data["cards"]] == [None, -0.25, None]
    assert json.loads(rep.to_json())["fit"]["l0"] == pytest.approx(8)
    fig = rep.cards.plot()
    assert fig.axes[0].get_xlabel().startswith("mean chosen − rejected activation")
    strings = attribute_features(llama, sae, [p.chosen for p in corpus], layer=0)
    lone = feature_report(llama, sae, strings, [p.chosen for p in corpus], top=2, n_contexts=1)
    assert math.isnan(lone.cards.cards[0].chosen)  # no pairs: no chosen-vs-rejected, written as null
    text = lone.to_json()
    assert "NaN" not in text and json.loads(text)["cards"][0]["difference_ci"] == [None, None]


def test_an_axis_of_the_wrong_length_is_refused_by_name(llama, sae, att, corpus):
    with pytest.raises(DataError, match=r"axis 'x' has 3 values but the corpus has 14 sequences; give 14"):
        feature_report(llama, sae, att, corpus, top=2, axes={"x": [1.0, 2.0, 3.0]})
