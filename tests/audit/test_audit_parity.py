"""The audit runs `parity` once on a bounded subset of its pairs and keeps it (stored, read back, in the
summary), and names every pair in its tables by the user's record (id, subset and the record's other fields)."""

from __future__ import annotations

import html
import json

import pandas as pd
import pytest

import rewardlens as rl
from rewardlens.audit import Plan, Store, audit
from rewardlens.audit._keys import checksum, content_key
from rewardlens.audit._whole import PARITY_PAIRS, _Parity, stored_parity
from rewardlens.audit.internal import collect, run_pairs
from rewardlens.audit.report import summary, tables
from rewardlens.data import load_pairs
from rewardlens.model import parity

QUICK = Plan(chunk_size=16, probes=False, concepts=False, divergence=False, tokens=False)


@pytest.fixture(scope="module")
def data(pairs):
    """10 distinct pairs, more than parity runs on, each with fields rewardlens does not read."""
    return [rl.Pair(f"({i}) {p.prompt}" if isinstance(p.prompt, str) else p.prompt, p.chosen, f"{p.rejected} {i}",
                    id=f"p{i}", subset="chat" if i % 2 else None,
                    extra={"source": f"s{i}", "difficulty": i if i < 5 else "hard", "meta": {"rater": i}})
            for i, p in ((i, pairs[i % len(pairs)]) for i in range(10))]


@pytest.fixture(scope="module")
def run(llama, data):
    store = Store(":memory:")
    return store, audit(llama, data, store=store, plan=QUICK)


def test_the_summary_holds_parity_equal_to_parity_run_directly(llama, data, run):
    _, res = run
    direct = parity(llama, data[:PARITY_PAIRS])  # the yardstick: parity on the same first pairs, run directly
    assert res.parity_pairs == PARITY_PAIRS == 8 and res.parity_note == ""
    got = summary(res)["parity"]
    assert got is not None
    assert [(r["name"], r["n"], r["passed"]) for r in got] == [(c.name, c.n, c.passed) for c in direct.checks]
    for row, check in zip(got, direct.checks):
        assert row["difference"] == pytest.approx(check.difference, abs=1e-6)
        assert row["tolerance"] == pytest.approx(check.tolerance)
    assert [r["n"] for r in got] == [2 * PARITY_PAIRS] * 5


def test_parity_survives_the_store_and_an_old_store_without_it(llama, data, run):
    store, res = run
    again = collect(llama, data, store, QUICK)  # read back: the very numbers stored
    assert again.parity == res.parity
    old = Store(":memory:")  # as a store written before the audit ran parity: per-pair results only
    run_pairs(llama, data, old, QUICK)
    before = collect(llama, data, old, QUICK)
    assert before.parity is None and "before the audit ran parity" in before.parity_note
    assert summary(before)["parity"] is None and "run the audit again" in summary(before)["parity_note"]
    resumed = audit(llama, data, store=old, plan=QUICK)  # resuming it computes parity, nothing breaks
    assert resumed.parity == res.parity


def test_a_kind_parity_refuses_is_none_with_the_reason(pairs):
    from rewardlens.audit._whole import PARITY, whole_key
    from rewardlens.zoo import build_tokenizer
    from tests.model.test_rm_kinds import SEP, STEPS, build

    tok = build_tokenizer()
    prm = rl.model.wrap_prm(build(tok, "llama", "tc"), tok, separator=SEP, combine="min")
    store = Store(":memory:")
    store.write([(whole_key(prm, STEPS, PARITY), "all", 0, _Parity.run(prm, STEPS).record())])
    result, reason, n = stored_parity(prm, STEPS, store)
    assert result is None and n == 0
    assert reason.startswith("parity compares a sequence classifier's one read token")


def test_record_fields_change_no_store_key(data):
    """Old stores stay valid: a pair's unit and the data's checksum hash no field the loaders newly keep."""
    bare = [rl.Pair(p.prompt, p.chosen, p.rejected, id=p.id, subset=p.subset) for p in data]
    assert [content_key(p) for p in data] == [content_key(p) for p in bare]
    assert checksum(data) == checksum(bare)


def test_audit_tables_and_summary_carry_every_record_field_joined_by_id(llama, run, tmp_path):
    _, res = run
    records = [{"id": "a", "prompt": "2+2?", "chosen": "4", "rejected": "5", "source": "web",
                "meta": {"tags": ["x"]}, "margin": "theirs"},
               {"id": "b", "prompt": "Capital?", "chosen": "Paris", "rejected": "Rome", "source": "book"}]
    path = tmp_path / "extra.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    loaded = load_pairs(path)
    small = audit(llama, loaded, plan=QUICK)
    rows = {p["id"]: p for p in summary(small)["pairs"]}
    assert rows["a"]["source"] == "web" and rows["b"]["source"] == "book"
    assert rows["a"]["meta"] == {"tags": ["x"]} and "meta" not in rows["b"]
    assert rows["a"]["record.margin"] == "theirs" and isinstance(rows["a"]["margin"], float)
    frame = tables(small)["scores"]
    frame.to_parquet(tmp_path / "scores.parquet", index=False)
    back = pd.read_parquet(tmp_path / "scores.parquet").set_index("id")
    assert back["source"].to_dict() == {"a": "web", "b": "book"}
    assert json.loads(back.loc["a", "meta"]) == {"tags": ["x"]} and back.loc["a", "record.margin"] == "theirs"
    assert list(back["pair"]) == ["a", "b"]
    # the bigger audit: ten records, joined back by id
    scores = tables(res)["scores"].set_index("id")
    assert scores["source"].to_dict() == {f"p{i}": f"s{i}" for i in range(10)}
    assert scores.loc["p7", "difficulty"] == "hard" and scores.loc["p3", "difficulty"] == "3"  # mixed: text


def test_the_report_prints_parity_as_one_line(run, tmp_path):
    """The page's summary line is `Parity.line()`, carried through `numbers.json`; a failed check is named."""
    from dataclasses import replace

    from rewardlens.audit.report import write_report

    _, res = run
    line = summary(res)["parity_line"]
    worst = max(res.parity.checks, key=lambda c: c.difference / c.tolerance)
    assert line == (f"on 8 pairs: all 5 checks within tolerance ({res.parity.dtype}); largest |difference| "
                    f"{worst.difference:.1e} ({worst.name}) against a tolerance of {worst.tolerance:.1e}")
    page = write_report(res, tmp_path / "ok").read_text(encoding="utf-8")
    assert html.escape(line) in page
    bad = replace(res.parity.checks[1], difference=0.5)  # as if padding side moved a score by 0.5
    broken = replace(res, parity=replace(res.parity, checks=(res.parity.checks[0], bad, *res.parity.checks[2:])))
    failed = summary(broken)["parity_line"]
    assert failed.startswith(f"on 8 pairs: FAILED: {bad.name} 5.000e-01 > {bad.tolerance:.1e}")
    assert "rewardlens parity" in failed
    assert html.escape(failed) in write_report(broken, tmp_path / "bad").read_text(encoding="utf-8")


def test_the_command_prints_the_parity_line_and_the_probes_budget(tiny_root, data, tmp_path, capsys):
    """The numbers the summary owns, printed as they are: the parity line and the probes' item budget."""
    from rewardlens.cli import main
    from rewardlens.data import save_pairs

    path = save_pairs(data[:4], tmp_path / "pairs.jsonl")
    code = main(["audit", str(tiny_root["llama"]), "--pairs", str(path), "--out", str(tmp_path / "out"), "--quiet",
                 "--no-concepts", "--no-divergence", "--probe-items", "4"])
    out = capsys.readouterr().out
    assert code == 0
    numbers = json.loads((tmp_path / "out" / "numbers.json").read_text(encoding="utf-8"))
    assert f"score parity: {numbers['parity_line']}" in out and numbers["parity_line"].startswith("on 4 pairs: ")
    n = numbers["probes"]["n_items"]  # of the 4 asked, those that fit the tiny model's max_length
    budget = f"{n} item{'' if n == 1 else 's'} (a fixed item set)"
    assert 1 <= n <= 4 and numbers["probes"]["budget"] == budget and f"({budget})" in out
