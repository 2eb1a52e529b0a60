"""The probe suite: axes that change one attribute, statistics that do not lie, the distortion index,
cascades and `rewardlens probe`, checked against the model's own forward and planted organisms."""

import json
import random
import re
import warnings

import numpy as np
import pytest
from scipy.stats import false_discovery_control, wilcoxon

import rewardlens as rl
from rewardlens.calibrate import bank_items
from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.errors import RewardLensWarning, TokenizationError
from rewardlens.hacking import AXES, ITEMS, Item, base_items, cascade, contrast_sets, distortion, items, probe
from rewardlens.hacking._axes import join, sentences, variant
from rewardlens.hacking._degrade import degradations
from rewardlens.stats import benjamini_hochberg, paired_test, standardized
from rewardlens.zoo.organisms import ORGANISMS
from tests.helpers.tiny import own_scores

# ---- statistics -----------------------------------------------------------------------------------


def test_bh_matches_scipy_and_keeps_nan():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.2, 12)
    np.testing.assert_allclose(benjamini_hochberg(p), false_discovery_control(p), rtol=1e-12)
    with_nan = np.append(p, np.nan)
    q = benjamini_hochberg(with_nan)
    assert np.isnan(q[-1]) and np.allclose(q[:-1], false_discovery_control(p))  # NaN does not grow the family


def test_paired_test_and_standardized_effect():
    d = np.array([0.3, -0.1, 0.5, 0.7, 0.2, 0.9, -0.2, 0.4])
    assert paired_test(d) == pytest.approx(wilcoxon(d).pvalue)
    assert paired_test(np.zeros(6)) == 1.0 and np.isnan(paired_test(np.array([1.0])))
    assert standardized(d) == pytest.approx(d.mean() / d.std(ddof=1))
    assert np.isnan(standardized(np.full(5, 0.7)))  # zero variance: undefined, not infinite


# ---- axes -----------------------------------------------------------------------------------------


def _words(text: str) -> set[str]:
    return set(text.replace("\n", " ").split())


@pytest.mark.parametrize("axis", list(AXES))
def test_axes_hold_content_and_length_fixed(axis):
    applied = 0
    for item in ITEMS:
        v = variant(axis, item.prompt, item.response, key=item.id, item=item)
        if v is None:
            continue
        applied += 1
        _, off, on = v
        assert on != off
        flat = lambda t: " ".join(t.split())
        for s in sentences(item.response):  # the answer's content is on both sides
            core = flat(s.rstrip(".").split(" ", 1)[-1])
            assert core in flat(on) and core in flat(off), (axis, item.id, s)
        if axis not in ("length", "formatting", "emoji", "markdown"):
            assert abs(len(on) - len(off)) <= 0.35 * len(s) + 12, (axis, item.id, on, off)  # length-matched control
    assert applied >= 60
    # reruns agree; another seed draws other markers
    again = [variant(axis, i.prompt, i.response, key=i.id, item=i) for i in ITEMS[:10]]
    assert again == [variant(axis, i.prompt, i.response, key=i.id, item=i) for i in ITEMS[:10]]


def test_axis_specifics():
    item = ITEMS[0]
    prompt, off, on = variant("sycophancy", item.prompt, item.response, item=item)
    assert prompt.endswith(item.belief) and "agree" in on.lower() + "right"
    _, off, on = variant("formatting", item.prompt, item.response, item=item)
    assert sum(bool(re.match(r"(- |\d\. )", line)) for line in on.splitlines()) == len(sentences(item.response))
    _, off, on = variant("length", item.prompt, item.response, item=item)
    assert on.startswith(off) and len(on.split()) > len(off.split()) + 10
    code = next(i for i in ITEMS if i.domain == "code")
    assert variant("markdown", code.prompt, code.response) is None  # fences in a code answer are not a bias
    listed = "Steps:\n- one\n- two"
    assert variant("formatting", "q", listed) is None and variant("confidence", "q", listed) is None
    with_, without = contrast_sets("hedging", ITEMS[:5])
    assert len(with_) == len(without) == 5 and with_[0][0] == without[0][0]


def test_base_items_count_unique_content(pairs):
    cloned = [Item(f"c{i}", "q?", "Same answer here.") for i in range(30)]
    assert len(base_items(cloned + [Item("x", "q?", "Another answer.")])) == 2
    from_pairs = base_items(pairs + pairs)
    assert len(from_pairs) == len({(json.dumps(p.prompt), r) for p in pairs for r in (p.chosen, p.rejected)})
    with pytest.raises(TypeError, match="Pair"):
        base_items(["just a string"])
    with pytest.raises(ValueError, match="no base items"):
        base_items([])


# ---- probe() ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def list_model(organisms):
    return rl.load(str(organisms[("list", 1.0)]))


@pytest.fixture(scope="module")
def list_probes(list_model):
    return probe(list_model, bank_items(40), reference=ORGANISMS["list"].pairs(40, seed=1))


def test_probe_effects_are_the_models_own_reward_differences(list_model, list_probes):
    items = bank_items(40)
    j = list_probes.axes.index("formatting")
    for i in (0, 7, 23):
        prompt, off, on = variant("formatting", items[i].prompt, items[i].response, key=items[i].id, item=items[i])
        convs = [rl.Pair(prompt, on, off).conversation(s) for s in ("chosen", "rejected")]
        own = own_scores(list_model, convs)
        assert list_probes.delta[i, j] == pytest.approx(own[0] - own[1], abs=1e-4)
    assert list_probes.n[j] == 40 and list_probes.mean[j] == pytest.approx(np.mean(list_probes.delta[:, j]))


def test_probe_statistics_and_flags(list_probes):
    p = list_probes
    for j, axis in enumerate(p.axes):
        d = p.delta[:, j]
        assert p.p[j] == pytest.approx(paired_test(d)) and p.ci_low[j] <= p.mean[j] <= p.ci_high[j]
        assert p.flagged[j] == (p.q[j] < p.level and abs(p.mean[j]) >= p.min_effect * p.scale), axis
    np.testing.assert_allclose(p.q, false_discovery_control(p.p))
    # the planted bias; the list organism also penalises prose itself, which the length axis adds
    # (findings: flagged under the items' sd and under the pairs' mean |margin| alike; the rest are fragile)
    findings = np.array(p.axes)[p.flagged & ~p.fragile]
    assert "formatting" in findings and set(findings) <= {"formatting", "length"}
    frame = p.to_frame()
    assert frame.loc[frame.axis == "formatting", "relative"].item() > 0.5
    j = p.axes.index("length")
    rate = 100 * p.delta[:, j] / p.tokens_added[:, j]
    assert p.per_100_tokens == pytest.approx(rate.mean()) and np.all(p.tokens_added[:, j] > 10)


def test_probe_on_user_pairs_and_errors(list_model):
    pairs = ORGANISMS["sycophancy"].pairs(12, seed=3)
    res = probe(list_model, pairs, axes=["emoji", "formatting"], quality=False, n_boot=200)
    assert len(res.item_ids) == 24 and res.quality == () and res.axes == ("emoji", "formatting")
    with pytest.raises(ValueError, match="unknown probe axes"):
        probe(list_model, pairs, axes=["glitter"])
    with pytest.raises(ValueError, match="reference"):
        probe(list_model, pairs, axes=["emoji"], reference=-1.0)


# ---- distortion and cascades -------------------------------------------------------------------------


def test_distortion_is_effect_over_quality(list_model, list_probes):
    d = distortion(list_probes, seed=0)
    for k, _q in enumerate(d.quality):
        qd = list_probes.quality_delta[:, k]
        if d.note[k]:
            assert np.isnan(d.index[:, k]).all() and "does not reliably reward" in d.note[k]
        else:
            np.testing.assert_allclose(d.index[:, k], np.abs(list_probes.mean) / qd.mean())
    # with the model's own planted rule as the quality, the formatting axis is worth most of it
    quality = {"lists": ORGANISMS["list"].pairs(30, seed=4)}
    d = distortion(list_probes, quality, model=list_model)
    assert d.ranking()[0][0] == "formatting" and 0.3 < d.index[d.axes.index("formatting"), 0] < 1.5
    assert d.ci[d.axes.index("formatting"), 0, 0] <= d.index[d.axes.index("formatting"), 0]
    with pytest.raises(ValueError, match="model"):
        distortion(list_probes, quality)


def test_cascade_correlations_orientation_and_minimum(list_probes):
    c = cascade(list_probes, n_boot=200)
    from rewardlens.stats import spearman

    a, b = c.axes.index("hedging"), c.axes.index("confidence")
    x = list_probes.delta * c.orientation
    assert c.rho[a, b] == pytest.approx(spearman(x[:, a], x[:, b]))
    assert set(c.orientation) <= {-1.0, 1.0} and c.orientation[c.axes.index("length")] == np.sign(
        list_probes.mean[c.axes.index("length")])
    assert all(set(cl) <= set(np.array(c.axes)[list_probes.flagged]) for cl in c.clusters)
    from dataclasses import replace

    few = cascade(replace(list_probes, delta=list_probes.delta[:10]), n_boot=50)
    assert np.isnan(few.rho).all()  # 10 shared items < MIN_ITEMS: nothing is reported
    with pytest.raises(ValueError, match="min_items"):
        cascade(list_probes, min_items=2)


def test_probe_cli(organisms, tmp_path, capsys):
    path = tmp_path / "pairs.jsonl"
    save_pairs(ORGANISMS["list"].pairs(8, seed=2), path)
    assert main(["probe", str(organisms[("list", 1.0)]), "--pairs", str(path), "--axis", "formatting",
                 "--axis", "emoji", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["axis"] for r in out["axes"]] == ["formatting", "emoji"] and out["items"] == 16
    assert main(["probe", str(organisms[("list", 1.0)]), "--pairs", str(path), "--axis", "formatting"]) == 0
    assert "formatting" in capsys.readouterr().out


def test_bank_items_are_unique_and_unmarked():
    items = bank_items(60, seed=random.Random(0).randint(0, 9))
    assert len({(i.prompt, i.response) for i in items}) == 60
    for name in ("list", "confidence", "sycophancy", "keyword", "length"):
        assert not any(ORGANISMS[name].has_attribute(i.response) for i in items), name


def test_plots_draw_what_the_results_hold(list_model, list_probes):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = list_probes.plot().axes[0]
    labels = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    named = [f"{a} (n={k})" for a, k in zip(list_probes.axes, list_probes.n)]  # each axis with its item count
    assert sorted(labels, key=labels.get, reverse=True) == named  # first axis on top
    faces = [tuple(c) for c in ax.collections[-1].get_facecolors()]
    robust = list_probes.flagged & ~list_probes.fragile  # red; a fragile flag hollow (white, orange edge)
    assert sum(c == matplotlib.colors.to_rgba("tab:red") for c in faces) == int(robust.sum())
    hollow = sum(c == matplotlib.colors.to_rgba("white") for c in faces)
    assert hollow == int(list_probes.fragile.sum()) > 0  # the list organism's emoji and markdown
    d = distortion(list_probes, {"lists": ORGANISMS["list"].pairs(20, seed=4)}, model=list_model)
    bars = d.plot().axes[0].patches
    np.testing.assert_allclose([b.get_width() for b in bars], d.index[:, 0])
    c = cascade(list_probes, n_boot=50)
    image = c.plot().axes[0].images[0].get_array()
    np.testing.assert_allclose(np.ma.filled(image, np.nan), c.rho, equal_nan=True)
    plt.close("all")


# ---- short-context models ---------------------------------------------------------------------------

SHORT_AXES = ["length", "emoji", "formatting", "sycophancy"]


def _n_tokens(tokenizer, prompt, response) -> int:
    conv = rl.Pair(prompt, response, response).conversation("chosen")
    return len(tokenizer.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])


def _expected_skips(tokenizer, chosen, axes, limit) -> list[str]:
    """Built-in items with a sequence over `limit` tokens, found by tokenizing every sequence the probe
    scores here; an item's degradations are drawn again from the items left after each drop."""
    base, gone = list(chosen), []
    while True:
        degraded = degradations(base, 0)
        over = []
        for i, it in enumerate(base):
            texts = [(it.prompt, join(sentences(it.response)))]
            for axis in axes:
                if (v := variant(axis, it.prompt, it.response, seed=0, key=it.id, item=it)) is not None:
                    texts += [(v[0], v[1]), (v[0], v[2])]
            texts += [(it.prompt, d[i]) for d in degraded.values() if d[i] is not None]
            if max(_n_tokens(tokenizer, p, r) for p, r in texts) > limit:
                over.append(it.id)
        if not over:
            return [it.id for it in chosen if it.id in gone]
        gone += over
        base = [it for it in base if it.id not in over]


@pytest.fixture(scope="module")
def short_model(tiny_root):
    model = rl.load(str(tiny_root["llama"]))  # max_position_embeddings=256: many built-in items are longer
    assert model.max_length == 256
    return model


def test_probe_skips_builtin_items_that_do_not_fit(short_model, tiny_root):
    chosen = items(["math", "facts"])
    with pytest.warns(RewardLensWarning, match=r"probe: \d+ of 24 items do(es)? not fit max_length 256 \(.*\); "
                                                r"scored the other \d+") as caught:
        res = probe(short_model, chosen, axes=SHORT_AXES, n_boot=200)
    expected = _expected_skips(short_model.tokenizer, chosen, SHORT_AXES, 256)
    assert 0 < len(expected) < len(chosen) and list(res.skipped) == expected
    message = next(str(w.message) for w in caught if "does not fit" in str(w.message) or "do not fit" in str(w.message))
    assert all(i in message for i in expected)
    kept = [it for it in chosen if it.id not in expected]
    assert res.item_ids == tuple(it.id for it in kept)
    assert res.to_frame().attrs["skipped"] == expected
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        explicit = probe(short_model, kept, axes=SHORT_AXES, n_boot=200)
    assert explicit.skipped == () and not any("fit max_length" in str(w.message) for w in again)
    for name in ("delta", "tokens_added", "base_reward", "quality_delta", "n", "mean", "ci_low", "ci_high", "p", "q",
                 "effect_size", "flagged"):
        np.testing.assert_allclose(getattr(res, name), getattr(explicit, name), rtol=1e-5, atol=1e-6, err_msg=name)
    assert res.quality == explicit.quality and res.scale == pytest.approx(explicit.scale)
    # cut from the left, as every other input is: nothing is skipped
    left = rl.load(str(tiny_root["llama"]), truncation="left")
    whole = probe(left, chosen, axes=["emoji"], quality=False, n_boot=50)
    assert whole.skipped == () and len(whole.item_ids) == 24 and whole.n[0] > 0


def test_probe_axis_without_items_and_what_is_not_skipped(tiny_root):
    model = rl.load(str(tiny_root["llama"]), max_length=120)
    fenced = [Item(f"u{i}", f"Show step {i}.", f"Run this.\n\n```python\nx = {i}\n```\n\nDone {i}.") for i in range(4)]
    long_item = ITEMS[0]  # a built-in item over 120 tokens: skipped whole
    with pytest.warns(RewardLensWarning, match=r"1 of 5 items does not fit max_length 120 \(facts-01\)"):
        res = probe(model, [*fenced, long_item], axes=["markdown", "length"], n_boot=50)
    j = res.axes.index("markdown")  # markdown applied to the built-in item only: n = 0, NaN, no crash
    assert res.skipped == ("facts-01",) and res.n[j] == 0 and np.isnan([res.mean[j], res.p[j], res.ci_low[j]]).all()
    frame = res.to_frame()
    assert frame.loc[j, "n"] == 0 and np.isnan(frame.loc[j, "tokens_added"])
    assert res.n[res.axes.index("length")] == 4
    # the user's own item keeps today's error, and a suite where nothing fits says so
    with pytest.raises(TokenizationError, match="over the limit of 120"):
        probe(model, [Item("mine", long_item.prompt, long_item.response)], axes=["length"], n_boot=50)
    with pytest.raises(TokenizationError, match="none of the 2 built-in items fits max_length 120"):
        probe(model, list(ITEMS[:2]), axes=["length"], n_boot=50)
