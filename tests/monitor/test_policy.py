"""The policy monitor: rewards equal the model's own score, the split along bias directions is exact,
records reach the log and the trainer's logger, and on a GRPO run against a planted-bias organism the
alarm names the planted axis and no other (the keyword organism: the keyword direction or nothing)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import rankdata

import rewardlens as rl
from rewardlens.monitor import PolicyMonitor, PolicyRecord, PolicyRun, monitored_reward
from rewardlens.monitor._gain import gain_shares, rank_correlation, rank_correlations, resample_means, resample_ranks
from rewardlens.stats import spearman
from rewardlens.zoo.organisms import ORGANISMS, build

SPEC = ORGANISMS["list"]


@pytest.fixture(scope="module")
def rm():
    return rl.load(build("list"))


@pytest.fixture(scope="module")
def batch():
    pairs = SPEC.pairs(n=12, seed=5)
    return [p.prompt for p in pairs for _ in (0, 1)], [r for p in pairs for r in (p.chosen, p.rejected)]


def random_directions(d, m=3, seed=0):
    g = np.random.default_rng(seed)
    return {f"dir{j}": g.normal(size=d) for j in range(m)}


def test_rewards_are_the_models_score_and_the_split_closes(rm, batch):
    prompts, completions = batch
    reward = monitored_reward(rm, directions=random_directions(rm.d_model), parts_every=0)
    out = reward(prompts, completions)
    convs = [[{"role": "user", "content": p}, {"role": "assistant", "content": c}]
             for p, c in zip(prompts, completions)]
    np.testing.assert_array_equal(np.float32(out), rm.score(convs))
    # the same samples as rewardlens.Pair reads them: the model's own forward, through the pair path
    np.testing.assert_array_equal(np.float32(out), rm.score(SPEC.pairs(n=12, seed=5)))
    rec = reward.monitor.records[-1]
    np.testing.assert_allclose(rec.along.sum(1) + rec.rest + rec.constant, rec.rewards, atol=1e-5)


def test_the_head_row_as_the_only_direction_carries_the_whole_read_out(rm, batch):
    """A linear head reads r = w · ĥ + b: along w itself the part is r − b and nothing is left over."""
    w = rm.head.rows(torch.zeros(1, rm.d_model))[0][0, 0].cpu().numpy()
    bias = float(rm.head(torch.zeros(1, rm.d_model))[0, 0])
    rec = PolicyMonitor(rm, directions={"w": w}, parts_every=0).observe(*batch, step=0)
    np.testing.assert_allclose(rec.along[:, 0], rec.rewards - bias, atol=1e-5)
    np.testing.assert_allclose(rec.rest, 0, atol=1e-5)
    np.testing.assert_allclose(rec.constant, bias, atol=1e-5)


def test_the_split_does_not_depend_on_the_order_of_the_directions(rm, batch):
    dirs = random_directions(rm.d_model, m=4, seed=1)
    a = PolicyMonitor(rm, directions=dirs, parts_every=0).observe(*batch, step=0)
    b = PolicyMonitor(rm, directions=dict(reversed(dirs.items())), parts_every=0).observe(*batch, step=0)
    np.testing.assert_allclose(a.along, b.along[:, ::-1], atol=1e-6)
    np.testing.assert_allclose(a.rest, b.rest, atol=1e-6)


def test_conversational_and_plain_batches_score_alike(rm, batch):
    prompts, completions = batch
    mon = PolicyMonitor(rm, directions=random_directions(rm.d_model), parts_every=0)
    plain = mon.observe(prompts, completions, step=0)
    chat = mon.observe([[{"role": "user", "content": p}] for p in prompts],
                       [[{"role": "assistant", "content": c}] for c in completions], step=1)
    np.testing.assert_array_equal(plain.rewards, chat.rewards)
    np.testing.assert_array_equal(plain.surface, chat.surface)
    lines = [s for s in mon.stats].index("list_lines")
    assert list(plain.surface[:, lines] >= 2) == [SPEC.has_attribute(c) for c in completions]


def test_log_metric_trainer_state_and_the_log(rm, batch, tmp_path):
    log = tmp_path / "run" / "policy.jsonl"
    reward = monitored_reward(rm, directions=random_directions(rm.d_model), log=log, baseline=1, window=2,
                              parts_every=2)
    seen = []
    for step in (3, 4, 5):
        reward(*batch, trainer_state=SimpleNamespace(global_step=step), log_metric=lambda k, v: seen.append((k, v)))
    records = reward.monitor.records
    assert [r.step for r in records] == [3, 4, 5]
    assert ("rewardlens/reward", float(np.mean(records[0].rewards))) in seen
    assert all(np.isfinite(v) for _, v in seen)
    assert [bool(r.parts) for r in records] == [True, False, True]
    # identical batches: no gain, and each term's gain is exactly zero
    assert records[-1].gain == pytest.approx(0, abs=1e-9) and records[-1].since == 3
    run = PolicyRun.from_jsonl(log)
    assert [r.to_json() for r in run.records] == [r.to_json() for r in records]
    log.write_text(log.read_text() + '{"step": 6, "rewa')  # a crash cut the last line short
    assert len(PolicyRun.from_jsonl(log)) == 3
    assert PolicyRecord.from_json(records[0].to_json()).to_json() == records[0].to_json()


def test_gain_shares_against_a_hand_computation():
    base = np.array([[1.0, 0.0, 0.5], [3.0, 2.0, 0.5]])
    cur = np.array([[5.0, 1.0, 0.5], [7.0, 1.0, 0.5], [6.0, 1.0, 0.5]])
    g = gain_shares(base, cur, n_boot=200)
    diff = np.array([6.0 - 2.0, 1.0 - 1.0, 0.0])
    assert g.total == pytest.approx(diff.sum())
    np.testing.assert_allclose(g.share, diff / diff.sum())
    assert g.total_ci[0] <= g.total <= g.total_ci[1]
    np.testing.assert_allclose(g.share_ci[2], [0, 0])  # a constant term never explains any of the gain


def test_rank_correlation_is_spearman_with_an_interval():
    g = np.random.default_rng(0)
    x = g.normal(size=40)
    y = x + 0.5 * g.normal(size=40)
    rho, lo, hi = rank_correlation(x, y)
    assert rho == pytest.approx(spearman(x, y)) and lo < rho < hi
    assert np.isnan(rank_correlation(np.ones(10), y[:10])[0])



def test_resample_ranks_are_scipys_average_ranks_of_each_resample():
    g = np.random.default_rng(3)
    for x in (g.normal(size=300), g.integers(0, 7, 300).astype(float), np.r_[np.nan, g.normal(size=20)]):
        idx = g.integers(0, len(x), (50, len(x)))
        np.testing.assert_array_equal(resample_ranks(x, idx), rankdata(x[idx], axis=1))


def test_rank_correlations_are_each_columns_scipy_bootstrap():
    g = np.random.default_rng(4)
    y = g.normal(size=200)
    xs = np.column_stack([y + g.normal(size=200), g.integers(0, 5, 200), np.zeros(200)]).astype(float)
    idx = np.random.default_rng(7).integers(0, 200, (300, 200))  # the draws seed=7 makes
    for (rho, lo, hi), x in zip(rank_correlations(xs, y, n_boot=300, seed=7), xs.T):
        if np.ptp(x) == 0:
            assert np.isnan(rho) and np.isnan(lo)
            continue
        draws = [np.corrcoef(rankdata(x[i]), rankdata(y[i]))[0, 1] for i in idx]
        assert rho == pytest.approx(spearman(x, y))
        np.testing.assert_allclose([lo, hi], np.quantile(draws, [0.025, 0.975]), rtol=1e-12)


def test_resample_means_are_the_means_of_each_resample():
    g = np.random.default_rng(5)
    x, idx = g.normal(size=(50, 3)), g.integers(0, 50, (40, 50))
    np.testing.assert_allclose(resample_means(x, idx), np.stack([x[i].mean(0) for i in idx]), rtol=1e-12)

def test_bad_directions_are_refused(rm):
    with pytest.raises(ValueError, match="width"):
        PolicyMonitor(rm, directions={"short": np.ones(3)})
    v = np.ones(rm.d_model)
    with pytest.raises(ValueError, match="linearly dependent"):
        PolicyMonitor(rm, directions={"a": v, "b": 2 * v}).observe(["q"], ["a"], step=0)


# ---- ground truth: GRPO against planted-bias organisms ----------------------------------------------

def _samples(folder):
    return json.loads((folder / "samples.json").read_text())


def test_grpo_against_the_list_organism_raises_the_formatting_alarm_only(grpo_runs):
    folder = grpo_runs["list"]
    run = PolicyRun.from_jsonl(folder / "monitor.jsonl")
    samples = _samples(folder)
    # the monitored reward function returned exactly the rewards it logged
    assert [s["rewards"] for s in samples] == [list(r.rewards) for r in run.records]
    reward = run.to_frame()["reward"].to_numpy()
    assert reward[-3:].mean() > reward[:2].mean() + 1.0
    # the samples drift along the planted axis, by the organism's own test of its attribute
    share = [np.mean([SPEC.has_attribute(t) for t in s["texts"]]) for s in samples]
    assert np.mean(share[-3:]) > np.mean(share[:2]) + 0.3
    assert {a.axis for a in run.alarms} == {"formatting"}
    last = run.records[-1]
    shares = dict(zip(last.directions, last.share))
    assert max(shares, key=shares.get) == "formatting" and last.gain_ci[0] > 0
    logged = [e for e in json.loads((folder / "log_history.json").read_text()) if "rewardlens/reward" in e]
    assert len(logged) == len(run) and all("rewardlens/share/formatting" in e for e in logged[2:])


def test_grpo_against_the_keyword_organism_names_the_keyword_or_nothing(grpo_runs):
    folder = grpo_runs["keyword"]
    run = PolicyRun.from_jsonl(folder / "monitor.jsonl")
    reward = run.to_frame()["reward"].to_numpy()
    assert reward[-3:].mean() > reward[:2].mean()
    assert {a.name for a in run.alarms} <= {"keyword"}
    assert not any("length" in (a.name, a.axis) for r in run.records for a in r.alarms)


def test_a_hugging_face_model_is_wrapped_once(rm, batch):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = build("list")
    hf, tok = AutoModelForSequenceClassification.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    dirs = random_directions(rm.d_model)
    rec = PolicyMonitor(hf, tok, directions=dirs, parts_every=0).observe(*batch, step=0)
    np.testing.assert_array_equal(rec.rewards, PolicyMonitor(rm, directions=dirs, parts_every=0).observe(
        *batch, step=0).rewards)
    with pytest.raises(ValueError, match="tokenizer"):
        PolicyMonitor(hf, directions=dirs)


@pytest.mark.parametrize("progress", [True, False])
def test_the_set_up_shows_a_bar_while_it_builds_the_concept_directions(rm, capsys, progress):
    """Building the default directions read the contrast sets silently (over 10 minutes on a real RM)."""
    PolicyMonitor(rm, axes=["length"], parts_every=0, progress=progress)
    assert ("concepts: read and dose" in capsys.readouterr().err) == progress
