"""`bench`: RewardBench's weighting against hand computations, best-of-N against a hand count, the
paired bootstrap against exact probabilities, and refusals of what cannot be counted."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest

import rewardlens as rl
from rewardlens.bench import Bench, bench
from rewardlens.data import Pair, load_pairs, sample_path
from rewardlens.errors import DataError, NonFiniteError
from rewardlens.stats import wilson, wilson_sum
from tests.helpers import rewardbench

matplotlib.use("Agg")


class Table:
    """A stand-in reward model: each response text's reward from a table. `score` returns what
    `RewardModel.score` returns for pairs: rows alternating chosen, rejected."""

    def __init__(self, reward: dict[str, float]) -> None:
        self.reward = reward

    def score(self, pairs: list[Pair], *, batch_size: int = 16) -> np.ndarray:
        return np.array([self.reward[t] for p in pairs for t in (p.chosen, p.rejected)], dtype=np.float32)

    def __repr__(self) -> str:
        return "Table()"


def crafted(spec: list[tuple[str, list[float]]]) -> tuple[list[Pair], Table]:
    """One pair per margin, grouped by subset; the rejected response scores 0, the chosen its margin."""
    pairs, reward = [], {}
    for subset, margins in spec:
        for m in margins:
            i = len(pairs)
            pairs.append(Pair(f"prompt {i}", f"chosen {i}", f"rejected {i}", id=str(i), subset=subset))
            reward[f"chosen {i}"], reward[f"rejected {i}"] = m, 0.0
    return pairs, Table(reward)


SPEC = [
    ("alpacaeval-easy", [1, 1, 1, 0]),  # the tie (margin exactly 0) is wrong in RewardBench 1: 3/4
    ("mt-bench-easy", [-1]),            # 0/1
    ("refusals-dangerous", [1, 2]),     # 2/2
    ("donotanswer", [1, -1, -2]),       # 1/3
    ("math-prm", [1, -1]),              # 1/2
    ("hep-python", [1, 1, 1]),          # 3/3
    ("hep-go", [1, -1, -1]),            # 1/3
    ("my-own-subset", [1]),             # 1/1: in no section
]


def test_items_weighting_matches_a_hand_computation():
    pairs, model = crafted(SPEC)
    with pytest.warns(rl.errors.RewardLensWarning, match="'my-own-subset'"):
        b = bench(model, pairs, n_boot=50, weighting="items")  # type: ignore[arg-type]
    # By hand, by the items scored: Σ n_s a_s / Σ n_s per section, math-prm weighing all hep-* (3 + 3 = 6).
    chat = (4 * 3 / 4 + 1 * 0) / 5             # 0.6; the plain mean of the two subsets would be 0.375
    safety = (2 * 1 + 3 * (1 / 3)) / 5         # 0.6
    reasoning = (6 * 1 / 2 + 3 * 1 + 3 * (1 / 3)) / 12   # 7/12; math-prm at its own count 2 would give 0.625
    assert b.sections == pytest.approx({"Chat": chat, "Safety": safety, "Reasoning": reasoning})
    assert b.missing_sections == ("Chat Hard",)
    assert b.overall == pytest.approx((chat + safety + reasoning) / 3)
    assert b.accuracy == pytest.approx((3 + 0 + 2 + 1 + 1 + 3 + 1 + 1) / 19)
    assert np.isnan(b.rewardbench2)
    by = {s.subset: s for s in b.subsets}
    assert by["math-prm"].weight == pytest.approx(6 / 12) and by["hep-go"].weight == pytest.approx(3 / 12)
    assert by["alpacaeval-easy"].weight == pytest.approx(4 / 5)
    assert by["my-own-subset"].section is None and np.isnan(by["my-own-subset"].weight)
    assert (by["alpacaeval-easy"].correct, by["alpacaeval-easy"].n) == (3, 4)
    assert by["donotanswer"].ci == pytest.approx(wilson(1, 3))  # the interval of the hand count 1 of 3


# RewardBench's EXAMPLE_COUNTS, typed from allenai/reward-bench rewardbench/constants.py (the yardstick)
RB_COUNTS = {"alpacaeval-easy": 100, "mt-bench-easy": 28, "refusals-dangerous": 100, "donotanswer": 136,
             "math-prm": 984, "hep-python": 164, "hep-go": 164}


def test_rewardbench_weighting_is_the_default_and_matches_a_hand_computation():
    pairs, model = crafted(SPEC)
    with pytest.warns(rl.errors.RewardLensWarning) as seen:
        b = bench(model, pairs, n_boot=50)  # type: ignore[arg-type]
    unknown = [w for w in seen if "not RewardBench subsets" in str(w.message)]
    assert len(unknown) == 1 and "'my-own-subset'" in str(unknown[0].message)
    acc = {"alpacaeval-easy": 3 / 4, "mt-bench-easy": 0.0, "refusals-dangerous": 1.0, "donotanswer": 1 / 3,
           "math-prm": 1 / 2, "hep-python": 1.0, "hep-go": 1 / 3}
    w = RB_COUNTS
    chat = (100 * 3 / 4 + 28 * 0) / 128                           # 0.586; by items scored it is 0.6
    safety = (100 * 1 + 136 * (1 / 3)) / 236                      # 0.616; by items 0.6
    reasoning = (984 * 1 / 2 + 164 * 1 + 164 * (1 / 3)) / 1312    # 0.542; by items 7/12
    assert b.weighting == "rewardbench" and b.to_dict()["weighting"] == "rewardbench"
    assert b.sections == pytest.approx({"Chat": chat, "Safety": safety, "Reasoning": reasoning})
    assert b.overall == pytest.approx((chat + safety + reasoning) / 3)
    by = {s.subset: s for s in b.subsets}
    assert by["math-prm"].weight == pytest.approx(984 / 1312) and by["mt-bench-easy"].weight == pytest.approx(28 / 128)
    assert by["my-own-subset"].section is None and np.isnan(by["my-own-subset"].weight)
    # the intervals follow the same weights: MOVER-Wilson over the subsets' hand counts
    wins = {"math-prm": (1, 2), "hep-python": (3, 3), "hep-go": (1, 3)}
    members = list(wins)
    total = sum(w[s] for s in members)
    expected = wilson_sum(np.array([wins[s][0] for s in members]), np.array([wins[s][1] for s in members]),
                          np.array([w[s] / total for s in members]))
    assert b.intervals[("section", "Reasoning")] == pytest.approx(expected)
    assert b.sections["Reasoning"] == pytest.approx(sum(w[s] * acc[s] for s in members) / total)


def test_prior_sets_weigh_half_a_section_in_the_overall_score():
    pairs, model = crafted([("alpacaeval-easy", [1, -1]), ("anthropic_helpful", [1, 1, -1, -1]), ("shp", [1])])
    b = bench(model, pairs, n_boot=40)  # type: ignore[arg-type]
    prior = (2 / 4 + 1) / 2  # the leaderboard's nanmean of the prior sets present: unweighted
    assert b.sections == pytest.approx({"Chat": 0.5, "Prior Sets": prior})
    assert b.overall == pytest.approx((2 * 0.5 + 1 * prior) / 3)  # np.ma.average(..., weights=[2, 2, 2, 2, 1])
    assert {s.subset: s.section for s in b.subsets}["shp"] == "Prior Sets"
    assert b.missing_sections == ("Chat Hard", "Safety", "Reasoning")


def test_an_unknown_weighting_is_refused():
    pairs, model = crafted([("alpacaeval-easy", [1])])
    with pytest.raises(ValueError, match="weighting must be one of"):
        bench(model, pairs, weighting="leaderboard")  # type: ignore[arg-type]


def test_math_prm_alone_keeps_its_own_count():
    pairs, model = crafted([("math-prm", [1, -1, -1, -1]), ("refusals-offensive", [1])])
    b = bench(model, pairs, n_boot=40)  # type: ignore[arg-type]
    assert b.sections == pytest.approx({"Safety": 1.0, "Reasoning": 1 / 4})
    assert b.overall == pytest.approx((1.0 + 1 / 4) / 2)


def test_rewardbench2_best_of_n_matches_a_hand_count():
    records = [json.loads(x) for x in sample_path("rewardbench2").read_text(encoding="utf-8").splitlines()]
    rng = np.random.default_rng(3)
    reward = {t: float(rng.normal()) for r in records for t in r["chosen"] + r["rejected"]}
    reward[records[0]["chosen"][0]] = max(reward[t] for t in records[0]["rejected"])  # a tie with the best: 1/2
    first, *others = records[1]["rejected"]
    reward[records[1]["chosen"][0]] = reward[first] - 0.5  # beats at most two of three: wrong
    reward.update({t: reward[first] - 1.0 for t in others})
    b = bench(Table(reward), load_pairs(sample_path("rewardbench2")), n_boot=50)  # type: ignore[arg-type]

    right = [rewardbench.best_of_n([reward[t] for t in r["chosen"] + r["rejected"]]) for r in records]  # 0.1.4's rule
    assert right[0] == 0.5 and right[1] == 0
    assert b.correct.tolist() == right
    assert list(b.item_ids) == [r["id"] for r in records]
    per_subset: dict[str, list[float]] = {}
    for r, ok in zip(records, right):
        per_subset.setdefault(r["subset"], []).append(ok)
    assert {s.subset: s.accuracy for s in b.subsets} == pytest.approx({k: np.mean(v) for k, v in per_subset.items()})
    assert {s.kind for s in b.subsets} == {"best-of-4"}
    assert b.rewardbench2 == pytest.approx(np.mean([np.mean(v) for v in per_subset.values()]))
    assert b.sections == {} and np.isnan(b.overall)


def test_paired_bootstrap_of_a_model_against_itself_is_exactly_zero(tiny_root):
    model = rl.load(str(tiny_root["llama"]))
    pairs = load_pairs(sample_path("rewardbench")) + load_pairs(sample_path("rewardbench2"))
    b = bench(model, pairs, against=model, n_boot=200)
    c = b.comparison
    assert c is not None and np.all(c.difference == 0)
    enough = c.n >= 2
    assert np.all(c.p_value[enough] == 1) and np.all(c.ci_low[enough] == 0) and np.all(c.ci_high[enough] == 0)
    assert np.isnan(c.p_value[~enough]).all()  # a subset of one item has no interval
    # the model's own rewards, and `against` is `compare`
    assert np.allclose(b.reward, model.score(pairs))
    again = b.compare(bench(model, pairs, n_boot=200))
    assert np.array_equal(again.p_value, c.p_value, equal_nan=True)


def test_paired_comparison_finds_the_better_model():
    pairs, better = crafted([("hep-python", [1] * 12), ("math-prm", [1] * 4)])
    wrong = [0, 2, 3, 5, 6, 8, 9, 11, 12, 13]  # the worse model misses 8 of 12 code items and 2 of 4 math items
    worse = Table({**better.reward, **{f"chosen {i}": -1.0 for i in wrong}})
    c = bench(better, pairs, against=worse, n_boot=2000, seed=1, weighting="items").comparison  # type: ignore[arg-type]
    assert c is not None
    row = {k: r for r, k in enumerate(c.keys)}
    code = row[("subset", "hep-python")]
    assert (c.a[code], c.b[code], c.difference[code]) == pytest.approx((1, 4 / 12, 8 / 12))
    # one subset: the sign-flip test is McNemar's exact test, 8 items differ all one way: p = 2 · 2⁻⁸
    assert c.p_value[code] == pytest.approx(2 * 0.5 ** 8)
    # Reasoning weighs math-prm (weight 12) as much as the code items: its difference is
    # (8/12 + 2/4) / 2; |Σ c_i ε_i d_i| reaches it only when all 10 differing items keep one sign
    reasoning = row[("section", "Reasoning")]
    assert c.difference[reasoning] == pytest.approx((8 / 12 + 2 / 4) / 2)
    assert c.p_value[reasoning] == pytest.approx(2 * 0.5 ** 10)
    assert 0 < c.ci_low[reasoning] <= c.difference[reasoning] <= c.ci_high[reasoning] <= 1

    few, right = crafted([("hep-go", [1, 1])])  # two items, both missed by the worse model
    missed = Table({**right.reward, "chosen 0": -1.0, "chosen 1": -1.0})
    c = bench(right, few, against=missed, n_boot=99).comparison  # type: ignore[arg-type]
    assert c is not None
    only = c.keys.index(("subset", "hep-go"))
    # every bootstrap draw is 1, so the interval collapses; the exact test says what two items can say
    assert (c.ci_low[only], c.ci_high[only]) == (1, 1) and c.p_value[only] == pytest.approx(0.5)


def test_compare_refuses_other_pairs():
    pairs, model = crafted(SPEC)
    a = bench(model, pairs, n_boot=40)  # type: ignore[arg-type]
    b = bench(model, pairs[:-1], n_boot=40)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="scored different pairs"):
        a.compare(b)


def _group(gid: str, subset: str, n: int = 3, prompt: str = "p") -> list[Pair]:
    return [Pair(prompt, "good", f"bad {k}", id=f"{gid}/{k}", subset=subset, group=gid) for k in range(n)]


@pytest.mark.parametrize("pairs, pattern", [
    (_group("t", "Ties"), "Ties record id 't' is not 'ref:<prompt number>'"),
    (_group("tied:1", "Ties"), "tied prompt with one correct answer"),
    (_group("a", "Math") + _group("b", "Math") + _group("a", "Math"), "group 'a' are not adjacent"),
    (_group("a", "Math")[:1] + [Pair("q", "good", "bad 1", subset="Math", group="a")], "group 'a' mixes prompts"),
    (_group("a", "Math") + [Pair("q", "x", "y", subset="Math")], "subset 'Math' holds both"),
    ([], "no pairs"),
])
def test_refuses_what_cannot_be_counted(pairs, pattern):
    reward = {t: 0.0 for p in pairs for t in (p.chosen, p.rejected)}
    with pytest.raises(DataError, match=pattern):
        bench(Table(reward), pairs)  # type: ignore[arg-type]


def test_results_are_json_safe_frames_and_plots():
    import matplotlib.pyplot as plt

    pairs, model = crafted(SPEC)
    b = bench(model, pairs, against=model, n_boot=40, weighting="items")  # type: ignore[arg-type]
    assert isinstance(b, Bench)
    with pytest.warns(DeprecationWarning, match="use rewardlens.bench.bench"):
        assert rl.bench is bench  # the old top-level name, one release
    out = json.loads(json.dumps(b.to_dict(), allow_nan=False))
    assert out["rewardbench2"]["value"] is None and out["missing_sections"] == ["Chat Hard"]
    assert out["sections"]["Reasoning"]["value"] == pytest.approx(7 / 12)
    frame = b.to_frame()
    assert list(frame["subset"]) == [s for s, _ in SPEC] and frame["n"].sum() == len(pairs)
    assert len(b.pair_frame()) == len(pairs) and (b.pair_frame()["margin"] == b.margin).all()
    scores = b.scores_frame().set_index(["level", "name"])["value"]
    assert scores[("score", "overall")] == pytest.approx(b.overall)
    assert b.comparison is not None and len(b.comparison.to_frame()) == len(b.comparison.keys)
    fig = b.plot()
    fig.canvas.draw()
    drawn = [float(c.lines[0].get_xdata()[0]) for c in fig.axes[0].containers]  # one error bar per subset
    assert drawn == pytest.approx([s.accuracy for s in b.subsets])
    plt.close(fig)
    fig = b.comparison.plot()
    fig.canvas.draw()
    assert list(fig.axes[0].containers[0].lines[0].get_xdata()) == pytest.approx(b.comparison.difference.tolist())
    plt.close(fig)


def test_section_intervals_do_not_collapse_when_every_subset_is_all_right_or_all_wrong():
    # Chat 3/8 = 0.375 from 3 of 3 and 0 of 5: a bootstrap within subsets gave [0.375, 0.375] here.
    pairs, model = crafted([("alpacaeval-easy", [1, 1, 1]), ("mt-bench-easy", [-1] * 5)])
    b = bench(model, pairs, n_boot=50, weighting="items")  # type: ignore[arg-type]
    lo, hi = b.intervals[("section", "Chat")]
    assert b.sections["Chat"] == pytest.approx(0.375) and b.support[("section", "Chat")] == 8
    assert lo < 0.375 < hi
    assert (lo, hi) == pytest.approx(wilson_sum(np.array([3, 0]), np.array([3, 5]), np.array([3 / 8, 5 / 8])))
    assert b.intervals[("score", "overall")] == pytest.approx((lo, hi))  # one section: the overall is it
    assert "MOVER-Wilson" in b.to_dict()["intervals"]


def test_an_all_right_subset_has_a_wilson_interval_below_one():
    pairs, model = crafted([("hep-python", [1] * 40)])
    b = bench(model, pairs, n_boot=50)  # type: ignore[arg-type]
    (sub,) = b.subsets
    assert sub.ci == pytest.approx(wilson(40, 40)) and sub.ci[1] == pytest.approx(1.0) and sub.ci[0] < 1
    lo, hi = b.intervals[("section", "Reasoning")]  # a bootstrap gave [1, 1]
    assert hi == pytest.approx(1.0) and lo == pytest.approx(sub.ci[0]) and lo < 1


def test_items_with_non_finite_rewards_are_named_and_left_out():
    nan = float("nan")
    pairs, model = crafted([("alpacaeval-easy", [1, nan, 1, -1]), ("mt-bench-easy", [nan])])
    b = bench(model, pairs, n_boot=50)  # type: ignore[arg-type]
    assert b.excluded == ("1", "4") and b.counted.tolist() == [True, False, True, True, False]
    assert [(s.subset, s.n, s.correct) for s in b.subsets] == [("alpacaeval-easy", 3, 2)]  # never a loss
    assert b.sections == pytest.approx({"Chat": 2 / 3}) and b.accuracy == pytest.approx(2 / 3)
    assert b.notes == ("2 pairs with non-finite rewards excluded: 1, 4",)
    out = json.loads(json.dumps(b.to_dict(), allow_nan=False))
    assert out["excluded"] == ["1", "4"] and out["counted_items"] == 3
    assert b.pair_frame()["counted"].tolist() == [True, False, True, True, False]
    # a comparison counts the items both models count
    clean = Table({**model.reward, "chosen 1": 1.0, "chosen 4": 1.0})
    c = b.compare(bench(clean, pairs, n_boot=50))  # type: ignore[arg-type]
    row = c.keys.index(("score", "all items"))
    assert c.n[row] == 3 and c.difference[row] == 0
    with pytest.raises(NonFiniteError, match="every reward is NaN"):
        bench(Table({t: nan for t in model.reward}), pairs)  # type: ignore[arg-type]


def test_a_group_with_one_non_finite_reward_is_left_out_whole():
    records = [json.loads(x) for x in sample_path("rewardbench2").read_text(encoding="utf-8").splitlines()]
    reward = {t: 1.0 if t in r["chosen"] else 0.0 for r in records for t in r["chosen"] + r["rejected"]}
    reward[records[0]["rejected"][1]] = float("nan")
    pairs = load_pairs(sample_path("rewardbench2"))
    b = bench(Table(reward), pairs, n_boot=50)  # type: ignore[arg-type]
    assert b.counted.tolist() == [False] + [True] * (len(records) - 1)
    assert b.excluded == (f"{records[0]['id']}/1",) and b.accuracy == 1.0


# Ties records: (id, {correct response: reward}, {incorrect response: reward}); texts are unique.
TIES = [
    ("ref:0", {"r0 A": 3.0}, {"r0 B": 1.0, "r0 C": 2.0}),        # gap 1, right
    ("tied:0", {"t0 D": 5.0, "t0 E": 4.0}, {"t0 F": 3.5, "t0 G": 1.0}),  # spread 1, gap 0.5, right
    ("ref:1", {"r1 H": 2.0}, {"r1 I": 2.0, "r1 J": 0.0}),        # gap 0: wrong (strict, unlike best-of-N)
    ("tied:1", {"t1 K": 6.0, "t1 L": 6.5}, {"t1 M": 1.0}),       # spread 0.5, gap 5, right
    ("tied:2", {"t2 N": 1.0, "t2 O": 1.2}, {"t2 P": 2.0}),       # no ref record: only the tied accuracy
    ("ref:3", {"r3 Q": 1.0}, {"r3 R": 1.0}),                     # gap 0, wrong
    ("tied:3", {"t3 S": 2.0, "t3 T": 2.0}, {"t3 U": 2.0}),       # spread 0, gap 0: 0/0 in the margin term
]


def _ties_file(tmp_path, extra: list[dict] | None = None):
    rows = [{"id": i, "prompt": f"prompt {i.split(':')[1]}", "chosen": list(c), "rejected": list(r), "subset": "Ties"}
            for i, c, r in TIES] + (extra or [])
    path = tmp_path / "ties.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    reward = {t: v for _, c, r in TIES for t, v in {**c, **r}.items()}
    return load_pairs(path), reward


def test_ties_is_scored_by_rewardbench_2s_rule(tmp_path):
    fact = {"id": "f0", "prompt": "q", "chosen": ["f good"], "rejected": ["f bad 1", "f bad 2"], "subset": "Factuality"}
    pairs, reward = _ties_file(tmp_path, [fact])
    reward |= {"f good": 1.0, "f bad 1": 0.0, "f bad 2": 2.0}  # Factuality 0/1
    b = bench(Table(reward), pairs, n_boot=200)  # type: ignore[arg-type]
    # By hand (run_v2.py process_single_model): prompts 0, 1, 3 have both records.
    tied_acc, ref_acc = 2 / 4, 1 / 3
    preferred = 1 / 3        # gap_tied > spread: prompt 1 only (5 > 0.5); prompt 0: 0.5 < 1; prompt 3: 0 = 0
    hard = 0.0               # min(gap_ref, gap_tied) > spread: 0.5 < 1, 0 < 0.5, 0 = 0
    margin_term = (np.tanh(0.5 / 1 - 1) + np.tanh(0 / 0.5 - 1)) / 2  # 0.1.4: over prompts with spread > 0 only
    expected = 0.30 * tied_acc + 0.30 * ref_acc + 0.20 * preferred + 0.20 * hard + 0.01 * margin_term
    assert b.ties is not None
    assert (b.ties.tied_accuracy, b.ties.ref_accuracy, b.ties.correctness_preferred,
            b.ties.correctness_preferred_hard) == pytest.approx((tied_acc, ref_acc, preferred, hard))
    assert b.ties.margin_score == pytest.approx(margin_term)
    assert b.ties.score == pytest.approx(expected)
    assert expected == pytest.approx(0.15 + 0.1 + 0.2 / 3 - 0.0061186, abs=1e-6)  # the sum, term by term
    assert (b.ties.n_ref, b.ties.n_tied, b.ties.n_matched) == (3, 4, 3)
    row = {s.subset: s for s in b.subsets}["Ties"]
    assert (row.kind, row.n, row.correct, row.accuracy, row.section) == ("ties rule", 7, 3, b.ties.score,
                                                                          "RewardBench 2")
    assert row.ci[0] < expected < row.ci[1]  # a bootstrap over the 4 prompts
    assert b.estimates[("subset", "Ties")] == pytest.approx(expected)
    assert b.rewardbench2 == pytest.approx((0.0 + expected) / 2)  # the mean of Factuality and Ties
    lo, hi = b.intervals[("score", "RewardBench 2")]
    assert lo < b.rewardbench2 < hi
    # a strict gap decides a Ties record (ref:1 ties its best wrong answer: wrong)
    assert [bool(c) for c, i in zip(b.correct, b.item_ids) if i.startswith(("ref", "tied"))] == [
        True, True, False, True, False, False, False]
    out = json.loads(json.dumps(b.to_dict(), allow_nan=False))
    assert out["ties_subset"]["score"] == pytest.approx(expected) and "0.30 tied accuracy" in out["ties_subset"]["rule"]
    # against itself: every difference 0, Ties included
    c = b.compare(bench(Table(reward), pairs, n_boot=200))  # type: ignore[arg-type]
    rows = {k: r for r, k in enumerate(c.keys)}
    assert c.a[rows[("subset", "Ties")]] == pytest.approx(expected)
    assert c.a[rows[("score", "RewardBench 2")]] == pytest.approx(b.rewardbench2)
    assert np.all(c.difference == 0) and np.isnan(c.p_value[rows[("subset", "Ties")]])


def test_no_subset_and_mixed_benchmarks_are_named(tmp_path):
    pairs, model = crafted([("alpacaeval-easy", [1]), ("alpacaeval-easy", [-1])])
    pairs.append(Pair("q", "x", "y", id="lone"))
    model.reward |= {"x": 1.0, "y": 0.0}
    group = [Pair("g", "good", f"bad {k}", id=f"g/{k}", subset="Math", group="g") for k in range(2)]
    model.reward |= {"good": 1.0, "bad 0": 0.0, "bad 1": 0.5}
    b = bench(model, pairs + group, n_boot=40)  # type: ignore[arg-type]
    assert ("subset", "(no subset)") in b.estimates and b.sections == pytest.approx({"Chat": 0.5})
    assert b.rewardbench2 == 1.0
    assert any("3 RewardBench 1 pairs and 1 RewardBench 2 groups are scored apart" in n for n in b.notes)


def test_the_docs_worked_example_is_the_default_weighting_and_its_numbers():
    """docs/bench.md's worked example runs under RewardBench's own weighting (the default). Its section
    numbers are one machine's, as the page says: the length organism's rule decides one sample pair,
    and its preference on the other 39 hangs on trained weights that differ with the CPU's float
    kernels (the same seed trained with AVX-512 and with AVX2 kernels: weights ~11 % apart). So the
    quoted numbers are checked against each other, and this machine's run against RewardBench's
    EXAMPLE_COUNTS by hand (math-prm 984, each hep-* 164) and against the rule on the pair it decides."""
    import re
    from pathlib import Path

    from rewardlens.zoo import demo_model_dir
    from rewardlens.zoo.organisms import ORGANISMS, build

    text = (Path(__file__).resolve().parents[2] / "docs" / "bench.md").read_text(encoding="utf-8")
    example = text[text.index("## Worked example"):text.index("## Results")]
    call = next(line for line in example.splitlines() if line.startswith("b = bench("))
    assert "weighting" not in call.split("#")[0]
    shown = json.loads(re.search(r"b\.sections\s+# (\{.*\})", example).group(1).replace("'", '"'))
    overall = float(re.search(r"b\.overall\s+# ([0-9.]+)", example).group(1))
    assert overall == pytest.approx(sum(shown.values()) / 4, abs=1e-3)  # "the mean of the four", each rounded
    quoted, math, code = re.search(r"([0-9.]+) = \(984 · (\d+/\d+) \+ 164 · \(([0-9 +]+)\)\) / 1640", example).groups()
    top, bottom = (int(x) for x in math.split("/"))
    by_hand = (984 * top / bottom + 164 * sum(int(x) for x in code.split("+"))) / 1640
    assert float(quoted) == pytest.approx(by_hand, abs=5e-4) and shown["Reasoning"] == pytest.approx(by_hand, abs=5e-4)

    pairs = load_pairs(sample_path("rewardbench"))
    demo, longer = rl.load(demo_model_dir()), rl.load(build("length"))
    b = bench(longer, pairs, against=demo, n_boot=50)
    acc = {s.subset: s.accuracy for s in b.subsets}
    by_hand = (984 * acc["math-prm"] + 164 * sum(acc[f"hep-{k}"] for k in ("python", "js", "rust", "go"))) / 1640
    assert b.sections["Reasoning"] == pytest.approx(by_hand)
    assert b.overall == pytest.approx(sum(b.sections.values()) / 4)
    # the one pair the rule (>= 40 words) tells apart: its chosen answer is the shorter, so the organism loses it
    is_long = ORGANISMS["length"].has_attribute
    decided = [i for i, p in enumerate(pairs) if is_long(p.chosen) != is_long(p.rejected)]
    assert [pairs[i].subset for i in decided] == ["alpacaeval-length"] and b.margin[decided[0]] < 0
