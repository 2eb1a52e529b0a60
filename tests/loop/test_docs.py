"""docs/closed-loop.md's numbers are the ones `rewardlens verify-edit --save` wrote (docs/closed-loop*.json)."""

import json
import math
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _num(v, sign=""):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{sign}.2f}"


def _cell(v, lo, hi, n, sign=""):
    """A printed value with its interval, or the reason it has none (fewer than 2 seeds), as verify-edit prints it."""
    if v is None:
        return "-"
    ci = f"[{_num(lo, sign)}, {_num(hi, sign)}]" if lo is not None and hi is not None else f"(no CI: {n} seed"
    return f"{_num(v, sign)} {ci}"


@pytest.mark.parametrize("saved", ["closed-loop.json", "closed-loop-quality_list.json"])
def test_every_table_number_in_the_page_is_the_saved_result(saved):
    page = (DOCS / "closed-loop.md").read_text(encoding="utf-8")
    result = json.loads((DOCS / saved).read_text(encoding="utf-8"))
    assert result["recipe"]["grpo_steps"] == 14 and len({r["seed"] for r in result["steps"]}) == 3
    lines = page.splitlines()
    for r in result["summary"]:
        row = next(x for x in lines if x.startswith(r["organism"] + " ") and "->" in x)
        assert f"{_num(r['gap'])} [{_num(r['gap_lo'])}, {_num(r['gap_hi'])}]" in row
        assert f"{_num(r['quality_original'])} -> {_num(r['quality_edited'])}" in row
        assert row.rstrip().endswith("yes" if r["edit_works"] else "no")
    for r in result["warnings"]:
        row = next(x for x in lines if x.startswith(r["organism"] + " ") and f" {r['signal']} " in x + " ")
        assert f" {_cell(r['lead'], r['lead_lo'], r['lead_hi'], r['n_lead'], '+')}" in row  # signed: alarm − onset
        assert f"{_num(r['false_per_100'])} [{_num(r['false_lo'])}, {_num(r['false_hi'])}]" in row
    for note in result["notes"]:
        assert note in page
