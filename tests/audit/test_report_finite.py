"""The audit's numbers with NaN pairs: the summary, per-subset accuracies and the report name the pairs
with non-finite rewards and count only the others; numbers.json stays strict JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Audit
from rewardlens.audit.report import summary, tables, write_report
from rewardlens.data import margin
from rewardlens.stats import wilson
from tests.helpers import finite

SUBSETS = ["chat", "safety", "chat", "safety", "chat", "safety"]


@pytest.fixture(scope="module")
def audit(tiny_root, tokenizer, tmp_path_factory):
    model = rl.load(str(finite.nan_word_model(tiny_root["llama"], tmp_path_factory.mktemp("injected") / "m",
                                              tokenizer)))
    pairs = finite.pairs(6, bad={3, 5}, subsets=SUBSETS)  # p3 and p5 are both in chat
    # Patching a NaN model fails in the causal engine; the faithfulness result only has to describe the
    # same pairs, so it comes from the clean model (the numbers under test are the rewards' and parts').
    clean = rl.load(str(tiny_root["llama"]))
    return Audit(model=repr(model), fingerprint="fp", data_checksum="sum", pair_ids=[p.id for p in pairs],
                 lens=rl.lens(model, pairs), sublayers=rl.attribute(model, pairs),
                 heads=rl.attribute(model, pairs, level="head"),
                 faithfulness=rl.faithfulness(clean, pairs, level="head"), subsets=SUBSETS)


def test_numbers_count_the_finite_pairs_and_name_the_others(audit):
    s = summary(audit)
    m = margin(audit.lens.reward.astype(np.float64))
    good = [0, 1, 3, 5]
    wins = int(np.sum(m[good] > 0))
    sc = s["scores"]
    assert (sc["counted"], sc["correct"], sc["excluded"]) == (4, wins, ["p3", "p5"])
    assert sc["accuracy"] == pytest.approx(wins / 4) and sc["accuracy_ci"] == pytest.approx(list(wilson(wins, 4)))
    assert sc["mean_margin"] == pytest.approx(m[good].mean())
    assert sc["line"].startswith(f"pair accuracy: {wins / 4:.3f} over 4 of 6 pairs (95% Wilson interval")
    assert sc["line"].endswith("; 2 pairs with non-finite rewards excluded: p3, p5")
    assert np.isfinite(s["closure_error"]["max"]) and s["closure_error"]["max"] < 1e-4
    chat = s["subsets"]["accuracy"]["chat"]
    assert (chat["n"], chat["total"], chat["excluded"]) == (1, 3, ["p3", "p5"])
    assert chat["correct"] == int(m[0] > 0)


def test_numbers_json_is_strict_and_the_report_names_the_pairs(audit, tmp_path):
    page = write_report(audit, tmp_path / "out")
    numbers = json.loads((tmp_path / "out" / "numbers.json").read_text(encoding="utf-8"),
                         parse_constant=lambda token: pytest.fail(f"numbers.json holds {token}"))
    assert numbers["pairs"][2]["chosen"] is None and numbers["scores"]["excluded"] == ["p3", "p5"]
    html = page.read_text(encoding="utf-8")
    assert "2 pairs with non-finite rewards excluded: p3, p5" in html and "<td>1 of 3</td>" in html
    wins = numbers["scores"]["correct"]
    assert f"({wins} of 4 counted)" in html and f"({wins} of 6)" not in html  # the summary counts what it scored


def test_figures_tables_and_subsets_read_one_pair_mask(audit):
    """With non-finite pairs (p3, p5; their faithfulness is finite here, so a mean over every pair differs from
    one over the counted pairs), the estimand figure and table, the heatmap, the top-parts table and the
    depth figures show the same numbers: the counted pairs' (a hand mask, not the report's)."""
    from rewardlens.audit.report import figures

    s, f = summary(audit), audit.faithfulness
    good = np.isfinite(margin(audit.lens.reward.astype(np.float64)))
    assert good.tolist() == [True, True, False, True, False, True]
    want = f.total[good].mean(0)
    assert not np.allclose(want, f.total.mean(0))  # the two masks would disagree here
    table = {row["part"]: row["total_effect"] for row in s["top_parts"]}
    split = {row["part"]: row["total"] for row in s["estimands"]}
    assert table.keys() == split.keys()
    for name, value in table.items():
        assert value == split[name] == pytest.approx(want[f.names.index(name)], rel=1e-12)
    bars = figures.fig_estimands(audit).axes[0].containers[2]  # direct, indirect, then total bars
    assert [b.get_width() for b in bars] == [row["total"] for row in s["estimands"]]
    heat = figures.fig_heatmaps(audit).axes[1].images[0].get_array()
    _, _, grid = figures.part_grid(list(f.names), want)
    np.testing.assert_array_equal(np.ma.filled(heat, np.nan), grid)
    for kind in ("linear", "normed"):
        depth = np.where(good, audit.lens.crystallization(kind, audit.fraction), np.nan)
        defined = depth[np.isfinite(depth)]
        median = float(np.median(defined)) if len(defined) else float("nan")
        assert s["lens"]["crystallization_defined"][kind] == len(defined)
        assert s["lens"]["crystallization_median"][kind] == pytest.approx(median, nan_ok=True)
        assert tables(audit)["scores"][f"crystallization_{kind}"].isna().tolist() == (~np.isfinite(depth)).tolist()
    titles = [ax.get_title() for ax in figures.fig_crystallization(audit).axes[:2]]
    assert [t.split(" pairs have")[0] for t in titles] == [
        f"{k} lens: {s['lens']['crystallization_defined'][k]} of 6" for k in ("linear", "normed")]
