"""RewardBench 2 scored as rewardbench 0.1.4 scores it: best-of-N ties share the credit (1/k), Ties records whose
correct answers are one text listed twice are scored, the Ties rule's corners, and `--n-boot` below a
meaningful interval refused. Yardstick: `tests.helpers.rewardbench`, 0.1.4's rules re-implemented."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.bench import bench
from rewardlens.cli import main
from rewardlens.data import Pair, load_pairs
from rewardlens.stats import wilson
from tests.bench.test_bench import Table
from tests.helpers import rewardbench


def _write(tmp_path, name: str, records: list[dict]) -> list[Pair]:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    with pytest.warns(rl.errors.DegeneratePairsWarning) if _repeats(records) else _nothing():
        return load_pairs(path)


def _repeats(records: list[dict]) -> bool:
    return any(len(set(r["chosen"])) < len(r["chosen"]) for r in records)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_two_tied_focus_records_score_as_rewardbench_0_1_4(tmp_path):
    # f1: the chosen ties one rejected at the top (1/2); f2: it ties two (1/3). rewardbench 0.1.4: 5/12.
    records = [{"id": "f1", "prompt": "p1", "chosen": ["a1"], "rejected": ["b1", "c1", "d1"], "subset": "Focus"},
               {"id": "f2", "prompt": "p2", "chosen": ["a2"], "rejected": ["b2", "c2", "d2"], "subset": "Focus"}]
    reward = {"a1": 1, "b1": 1, "c1": 0, "d1": 0, "a2": 2, "b2": 2, "c2": 2, "d2": 0}
    pairs = _write(tmp_path, "focus.jsonl", records)
    expected = [rewardbench.best_of_n([reward[t] for t in r["chosen"] + r["rejected"]]) for r in records]
    assert expected == pytest.approx([1 / 2, 1 / 3])
    b = bench(Table(reward), pairs, n_boot=40)  # type: ignore[arg-type]
    assert b.correct.tolist() == pytest.approx(expected) and b.best_of_n_ties == "shared"
    (focus,) = b.subsets
    assert focus.accuracy == pytest.approx(5 / 12) and focus.correct == pytest.approx(5 / 6)
    assert focus.ci == pytest.approx(wilson(5 / 6, 2))
    assert b.rewardbench2 == pytest.approx(0.4167, abs=1e-4) and b.accuracy == pytest.approx(5 / 12)
    out = b.to_dict()
    assert out["best_of_n_ties"] == "shared" and "rewardbench 0.1.4" in out["ties"]
    assert [i["correct"] for i in out["items"]] == pytest.approx(expected)
    # the earlier utils_v2.py rule, kept by name: a tie at the top is right
    old = bench(Table(reward), pairs, n_boot=40, best_of_n_ties="argmax")  # type: ignore[arg-type]
    assert old.correct.tolist() == [1.0, 1.0] and old.rewardbench2 == 1.0 and "utils_v2.py" in old.to_dict()["ties"]
    with pytest.raises(rl.errors.DataError, match="different rules"):
        b.compare(old)
    with pytest.raises(ValueError, match="best_of_n_ties must be one of"):
        bench(Table(reward), pairs, best_of_n_ties="first")  # type: ignore[arg-type]


def test_best_of_n_equals_rewardbench_on_tie_heavy_records(tmp_path):
    # integer rewards in {0, 1, 2}: ties at the top are common; some records list two chosen responses,
    # where rewardbench reads only the first (scores[0]) and counts every response tied at the top.
    rng = np.random.default_rng(7)
    records, reward = [], {}
    for i in range(30):
        chosen = [f"r{i} c{j}" for j in range(1 + (i % 3 == 0))]
        rejected = [f"r{i} x{k}" for k in range(3)]
        reward |= {t: float(rng.integers(0, 3)) for t in chosen + rejected}
        records.append({"id": f"r{i}", "prompt": f"p{i}", "chosen": chosen, "rejected": rejected,
                        "subset": ("Focus", "Math")[i % 2]})
    b = bench(Table(reward), _write(tmp_path, "rb2.jsonl", records), n_boot=40)  # type: ignore[arg-type]
    expected = np.array([rewardbench.best_of_n([reward[t] for t in r["chosen"] + r["rejected"]]) for r in records])
    assert 0 < np.mean((expected > 0) & (expected < 1))  # some records share the top
    assert b.correct == pytest.approx(expected)
    for k, subset in enumerate(("Focus", "Math")):
        assert {s.subset: s.accuracy for s in b.subsets}[subset] == pytest.approx(expected[k::2].mean())
    assert b.rewardbench2 == pytest.approx((expected[0::2].mean() + expected[1::2].mean()) / 2)


def _ties(tmp_path, rows: list[tuple[str, list[str], list[str]]], reward: dict[str, float]):
    records = [{"id": i, "prompt": f"prompt {i.split(':')[1]}", "chosen": c, "rejected": r, "subset": "Ties"}
               for i, c, r in rows]
    scored = [{"id": i, "scores": [reward[t] for t in c + r], "num_correct": len(c)} for i, c, r in rows]
    return _write(tmp_path, "ties.jsonl", records), rewardbench.ties(scored)


def test_a_ties_record_whose_correct_answers_are_one_text_is_scored_as_rewardbench_scores_it(tmp_path):
    rows = [("ref:0", ["r0 a"], ["r0 b", "r0 c"]),
            ("tied:0", ["same 0", "same 0"], ["t0 x"]),     # num_correct 2, one text: spread 0, gap 1
            ("ref:1", ["r1 a"], ["r1 b"]),
            ("tied:1", ["t1 a", "t1 b"], ["t1 x"]),         # spread 1: the margin term's only prompt
            ("ref:2", ["r2 a"], ["r2 b"]),
            ("tied:2", ["same 2", "same 2", "same 2"], ["t2 x", "t2 y"])]  # spread 0, gap -1
    reward = {"r0 a": 3.0, "r0 b": 1.0, "r0 c": 2.0, "same 0": 4.0, "t0 x": 3.0,
              "r1 a": 2.0, "r1 b": 0.0, "t1 a": 5.0, "t1 b": 4.0, "t1 x": 1.0,
              "r2 a": 1.0, "r2 b": 0.0, "same 2": 0.0, "t2 x": 1.0, "t2 y": 0.5}
    pairs, expected = _ties(tmp_path, rows, reward)
    b = bench(Table(reward), pairs, n_boot=40)  # type: ignore[arg-type]
    assert b.ties is not None and (b.ties.n_ref, b.ties.n_tied, b.ties.n_matched) == (3, 3, 3)
    got = {k: getattr(b.ties, k) for k in expected}
    assert got == pytest.approx(expected)
    # prompt 1 alone (spread 1, min gap 2): 0.1.4 skips the zero spreads, where tanh(h / 0 - 1) would be ±1
    assert b.ties.margin_score == pytest.approx(np.tanh(min(2.0, 3.0) / 1.0 - 1))
    assert b.ties.correctness_preferred == pytest.approx(2 / 3)  # prompts 0 and 1: gap > spread


def test_ties_without_a_matched_prompt_scores_its_accuracies_as_rewardbench_0_1_4(tmp_path):
    rows = [("ref:0", ["r0 a"], ["r0 b"]), ("tied:1", ["t1 a", "t1 b"], ["t1 x"])]
    reward = {"r0 a": 1.0, "r0 b": 0.0, "t1 a": 2.0, "t1 b": 1.5, "t1 x": 3.0}
    pairs, expected = _ties(tmp_path, rows, reward)
    b = bench(Table(reward), pairs, n_boot=40)  # type: ignore[arg-type]
    assert b.ties is not None and b.ties.n_matched == 0
    assert b.ties.score == pytest.approx(expected["score"]) == pytest.approx(0.3 * 0 + 0.3 * 1)  # not NaN


def test_ties_equal_rewardbench_on_random_records_with_repeated_answers(tmp_path):
    rng = np.random.default_rng(11)
    rows, reward = [], {}
    for p in range(12):
        for kind in ("ref", "tied"):
            if rng.random() < 0.2:
                continue
            n = 1 if kind == "ref" else int(rng.integers(2, 4))
            chosen = [f"{kind}{p} c{j}" for j in range(n)]
            chosen = [chosen[0]] * n if kind == "tied" and p % 3 == 0 else chosen
            rejected = [f"{kind}{p} x{k}" for k in range(int(rng.integers(1, 4)))]
            reward |= {t: float(rng.integers(0, 4)) + 0.5 * float(rng.random() < 0.5) for t in chosen + rejected}
            rows.append((f"{kind}:{p}", chosen, rejected))
    pairs, expected = _ties(tmp_path, rows, reward)
    b = bench(Table(reward), pairs, n_boot=40)  # type: ignore[arg-type]
    assert b.ties is not None
    assert {k: getattr(b.ties, k) for k in expected} == pytest.approx(expected)


@pytest.mark.filterwarnings("ignore::rewardlens.errors.DegeneratePairsWarning")  # repeated texts are the point
def test_cli_best_of_n_ties_flag_and_an_identical_answers_ties_record(capsys, tiny_root, tmp_path):
    llama = str(tiny_root["llama"])
    records = [{"id": "f", "prompt": "Say hi.", "chosen": ["hi"], "rejected": ["hi", "hi", "bye"], "subset": "Focus"},
               {"id": "ref:0", "prompt": "Name a prime.", "chosen": ["7"], "rejected": ["4"], "subset": "Ties"},
               {"id": "tied:0", "prompt": "Name a prime.", "chosen": ["7", "7"], "rejected": ["8"], "subset": "Ties"}]
    path = tmp_path / "rb2.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    pairs = load_pairs(path)
    reward = rl.load(llama).score(pairs).astype(np.float64)  # the model's own rewards: the yardstick's input
    focus = [reward[0], reward[1], reward[3], reward[5]]  # chosen, then the three rejected, in record order
    ties = rewardbench.ties([{"id": "ref:0", "scores": [reward[6], reward[7]], "num_correct": 1},
                             {"id": "tied:0", "scores": [reward[8], reward[10], reward[9]], "num_correct": 2}])
    shared, right = rewardbench.best_of_n(focus), float(focus[0] >= max(focus[1:]))
    assert 0 < shared < right == 1  # "hi" ties itself at the top: the two rules differ here
    for flag, want in (([], shared), (["--best-of-n-ties", "argmax"], right)):
        assert main(["bench", llama, "--pairs", str(path), "--n-boot", "40", "--json", *flag]) == 0
        out = json.loads(capsys.readouterr().out)
        assert {s["subset"]: s["accuracy"] for s in out["subsets"]}["Focus"] == pytest.approx(want)
        assert out["ties_subset"]["score"] == pytest.approx(ties["score"]) and out["ties_subset"]["n_tied"] == 1
        assert out["best_of_n_ties"] == (flag[1] if flag else "shared")


@pytest.mark.parametrize("n_boot", ["1", "39"])
def test_cli_refuses_too_few_bootstrap_draws_in_one_line(capsys, tiny_root, n_boot):
    from rewardlens.data import sample_path

    code = main(["bench", str(tiny_root["llama"]), "--pairs", str(sample_path("rewardbench")), "--n-boot", n_boot])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"--n-boot {n_boot} is under 40" in err and "pass --n-boot 40 or more" in err


def test_too_few_bootstrap_draws_are_refused_in_python():
    pairs = [Pair("q", "a", "b", id="0", subset="alpacaeval-easy")]
    model = Table({"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match="n_boot is 39, under 40"):
        bench(model, pairs, n_boot=39)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_boot is 199, under 200"):
        bench(model, pairs, n_boot=199, level=0.99)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_boot is 2, under 40"):
        bench(model, pairs, n_boot=40).compare(bench(model, pairs, n_boot=40), n_boot=2)  # type: ignore[arg-type]
