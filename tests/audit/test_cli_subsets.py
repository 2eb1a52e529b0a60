"""`rewardlens audit` groups by subset: the printed per-subset table and `--json` carry each subset's
pairs and accuracy (checked against the pairs' own margins), and pairs without subsets get one line
saying there are no per-subset tables."""

import json

import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import margin, save_pairs
from rewardlens.stats import wilson
from tests.helpers import tiny

SUBSETS = ["chat", "safety", "chat", "math-prm", "chat"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tokenizer):
    return tiny.build("llama", tokenizer, tmp_path_factory.mktemp("llama"))


def _pairs(subsets):
    base = tiny.PAIRS
    return [rl.Pair(f"({i}) {base[i % 2].prompt}", base[i % 2].chosen, base[i % 2].rejected + f" {i}", id=f"p{i}",
                    subset=s) for i, s in enumerate(subsets)]


def _argv(model, pairs_file, out, *extra):
    return ["audit", str(model), "--pairs", str(pairs_file), "--out", str(out), "--no-probes", "--no-concepts",
            "--no-divergence", "--quiet", *extra]


def test_the_summary_groups_by_subset(llama, tmp_path, capsys):
    pairs = _pairs(SUBSETS)
    path = save_pairs(pairs, tmp_path / "pairs.jsonl")
    assert main(_argv(llama, path, tmp_path / "json", "--json")) == 0
    got = json.loads(capsys.readouterr().out)
    m = margin(rl.load(str(llama)).score(pairs))
    assert got["subsets"]["names"] == ["chat", "math-prm", "safety"]
    for name in got["subsets"]["names"]:
        rows = [i for i, s in enumerate(SUBSETS) if s == name]
        wins = int(sum(m[i] > 0 for i in rows))
        acc = got["subsets"]["accuracy"][name]
        assert (acc["n"], acc["correct"]) == (len(rows), wins)
        assert [acc["lo"], acc["hi"]] == pytest.approx(list(wilson(wins, len(rows))))
    assert [p["subset"] for p in got["pairs"]] == SUBSETS
    assert got["divergence"] is None  # --no-divergence

    assert main(_argv(llama, path, tmp_path / "table")) == 0
    text = capsys.readouterr().out
    assert "by subset" in text and "mean total effect of the top parts per subset" in text
    table = text.split("by subset", 1)[1]
    for name in ("chat", "math-prm", "safety"):
        line = next(row for row in table.splitlines() if row.startswith(name + " "))
        assert line.split()[1] == str(SUBSETS.count(name))  # the pairs column


def test_pairs_without_subsets_say_so(llama, tmp_path, capsys):
    path = save_pairs(_pairs([None] * 3), tmp_path / "pairs.jsonl")
    assert main(_argv(llama, path, tmp_path / "out")) == 0
    text = capsys.readouterr().out
    assert "the pairs carry no subset field: no per-subset tables" in text and "by subset (" not in text


def test_the_shipped_rewardbench_sample_audits_into_per_subset_tables(llama, tmp_path, capsys):
    from rewardlens.bench import SECTION_OF
    from rewardlens.data import load_pairs, sample_path

    path = sample_path("rewardbench")
    pairs = load_pairs(path)
    subsets = sorted({p.subset for p in pairs})
    assert {SECTION_OF[s] for s in subsets} == {"Chat", "Chat Hard", "Safety", "Reasoning"}  # all four sections
    assert main(_argv(llama, path, tmp_path / "rb", "--json", "--no-tokens")) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["subsets"]["names"] == subsets
    page = (tmp_path / "rb" / "report.html").read_text(encoding="utf-8")
    assert all(f">{s}<" in page for s in subsets)  # each subset has its row in the report's table
