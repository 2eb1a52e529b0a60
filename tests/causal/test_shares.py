"""Shares of the margin that pairs whose margins disagree in sign cannot send through a near-zero denominator
(issue 42, item 2): a circuit's or a part's share is taken against each pair's own margin (|margin|-weighted,
`stats.margin_share`), the ratio of means is kept as `share_of_mean_margin`, and every command prints one
warning line (`stats.share_warning`) when that ratio is ill-conditioned, and none when the pairs agree.

The planted disagreement: a pair and the same pair with chosen and rejected swapped, whose clean margins are
m and −m (the mean margin cancels to ~0)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import margin, save_pairs
from rewardlens.stats import SMALL_MEAN_MARGIN, margin_share, share_warning


def _swap(pair: rl.Pair) -> rl.Pair:
    return dataclasses.replace(pair, chosen=pair.rejected, rejected=pair.chosen, id=f"{pair.id or 'pair'}-swapped")


@pytest.fixture(scope="module")
def model(tiny_root):
    return rl.load(str(tiny_root["llama"]))


@pytest.fixture(scope="module")
def agreeing(model, pairs):
    """Two pairs turned so the model prefers the chosen side of both (their margins agree in sign)."""
    first = [p for p, m in zip(pairs, margin(model.score(list(pairs)))) if abs(m) > 1e-3][:2]
    m = margin(model.score(first))
    return [p if x > 0 else _swap(p) for p, x in zip(first, m)]


@pytest.fixture(scope="module")
def disagreeing(agreeing):
    """The first pair as it is and swapped: margins m and −m."""
    return [agreeing[0], _swap(agreeing[0])]


def _weighted(values: np.ndarray, margins: np.ndarray) -> np.ndarray:
    """The yardstick: the mean of the per-pair shares values_i / m_i weighted by |m_i| (the documented definition)."""
    w = np.abs(margins)
    return (w[:, None] * (values / margins[:, None])).sum(0) / w.sum()


def test_the_share_is_each_pairs_own_margin_weighted_and_the_warning_names_disagreement():
    rng = np.random.default_rng(0)
    m = np.array([1.0, -0.9, 0.5, 2.0])
    v = rng.normal(size=(4, 3))
    np.testing.assert_allclose(margin_share(v, m), _weighted(v, m), rtol=1e-12)
    flip = np.array([1, -1, 1, -1.0])  # swapping chosen and rejected of a pair negates its margin and its effects
    np.testing.assert_allclose(margin_share(v * flip[:, None], m * flip), margin_share(v, m), rtol=1e-12)
    assert np.isnan(margin_share(v, np.full(4, 1e-7))).all()  # no margin to share
    line = share_warning(np.array([1.0, -0.9]))
    assert line is not None and "\n" not in line and "disagree" in line and "split the pairs" in line
    assert share_warning(np.array([1.0, 0.8, 1.2])) is None
    assert share_warning(np.array([1.0, -0.2])) is None  # |mean| 0.4 ≥ SMALL_MEAN_MARGIN × mean |margin| 0.6
    edge = np.array([1.0, -(1 - SMALL_MEAN_MARGIN) / (1 + SMALL_MEAN_MARGIN) * 1.01])
    assert share_warning(edge) is not None  # just past the documented fraction
    assert "near zero" in (share_warning(np.array([1e-6, -1e-6])) or "")


def test_circuit_share_on_disagreeing_pairs_is_finite_bounded_and_warned(model, disagreeing):
    c = rl.circuit(model, disagreeing, method="eap", top=3)
    assert abs(c.clean.mean()) < 1e-3 * np.abs(c.clean).mean()  # the planted cancellation
    assert np.isfinite(c.shares).all()
    # bounded by the triangle inequality: |Σ sign(m_i) m_i(C)| ≤ n · max |m_i(C)|
    assert (np.abs(c.shares) <= np.abs(c.margins).max() / np.abs(c.clean).mean() + 1e-9).all()
    assert c.shares[-1] == pytest.approx(1.0, abs=1e-5)  # every edge kept: the clean run
    # the yardstick: each pair's circuit alone (same ranked edges), its margin over its own clean margin
    scored = rl.edges(model, disagreeing, method="eap")
    alone = [rl.circuit(model, [p], edges=scored, top=3, sizes=c.sizes) for p in disagreeing]
    per_pair = np.stack([a.margins[:, 0] / a.clean[0] for a in alone], 1)  # [S, 2]
    np.testing.assert_allclose(c.pair_shares, per_pair, rtol=1e-4, atol=1e-6)
    w = np.abs([a.clean[0] for a in alone])
    np.testing.assert_allclose(c.shares, (per_pair * w).sum(1) / w.sum(), rtol=1e-4, atol=1e-6)
    assert c.warning is not None and "disagree" in c.warning
    assert c.to_dict()["warning"] == c.warning and "share_of_mean_margin" in c.summary().index


def test_circuit_on_agreeing_pairs_has_no_warning_and_keeps_the_ratio_of_means(model, agreeing):
    c = rl.circuit(model, agreeing, method="eap", top=3)
    assert (c.clean > 0).all() and c.warning is None
    # every margin positive: the share of each pair's own margin is the ratio of means
    np.testing.assert_allclose(c.shares, c.margins.mean(1) / c.clean.mean(), rtol=1e-6, atol=1e-9)  # float32 margins
    np.testing.assert_allclose(c.shares_of_mean_margin, c.margins.mean(1) / c.clean.mean(), rtol=1e-6, atol=1e-9)


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("command", [["circuit", "--method", "eap", "--top", "3"], ["patch", "--top", "3"]])
def test_commands_warn_on_disagreeing_pairs_only(capsys, tiny_root, tmp_path, agreeing, disagreeing, command):
    folder = str(tiny_root["llama"])
    for pairs, warned in ((disagreeing, True), (agreeing, False)):
        path = str(save_pairs(pairs, tmp_path / "pairs.jsonl"))
        assert main([command[0], folder, "--pairs", path, *command[1:], "--quiet"]) == 0
        lines = _warnings(capsys.readouterr().out)
        assert len(lines) == (1 if warned else 0), lines
        if warned:
            assert "split the pairs by the sign of their margin" in lines[0]
        assert main([command[0], folder, "--pairs", path, *command[1:], "--quiet", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        got = out["circuit"]["warning"] if command[0] == "circuit" else out["share_warning"]
        assert (got is not None) == warned
        shares = ([p["share"] for p in out["circuit"]["curve"]] if command[0] == "circuit"
                  else [t["share"] for t in out["top_parts"]])
        assert all(s is not None and abs(s) < 1e3 for s in shares)  # finite: never divided by the cancelled mean


def test_patch_share_is_each_pairs_own_margin(model, disagreeing):
    from rewardlens.cli.causal import patch_summary

    res = rl.patch(model, disagreeing)
    out = patch_summary(model, disagreeing, top=len(res.names))
    want = dict(zip(res.names, _weighted(res.effect, res.margin)))
    for t in out["top_parts"]:
        assert t["share"] == pytest.approx(want[t["part"]], rel=1e-6, abs=1e-9)


def test_the_audit_prints_and_pages_the_warning(capsys, tiny_root, tmp_path, disagreeing):
    path = str(save_pairs(disagreeing, tmp_path / "pairs.jsonl"))
    argv = ["audit", str(tiny_root["llama"]), "--pairs", path, "--out", str(tmp_path / "out"), "--circuit",
            "--no-probes", "--no-concepts", "--no-divergence", "--no-tokens", "--quiet"]
    assert main(argv) == 0
    lines = _warnings(capsys.readouterr().out)
    assert len(lines) == 1 and "disagree" in lines[0]
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    section = page[page.index('<section id="circuit">'):]
    assert "margins disagree in sign" in section[:section.index("</section>")]
    numbers = json.loads((tmp_path / "out" / "numbers.json").read_text())
    assert numbers["circuit"]["warning"] and numbers["circuit"]["share"] is not None
