"""Every ranked table the CLI prints shows the statistic it is ranked by, beside the signed mean, and its rows
are sorted by that column (issue 42, item 3): the tables are read back from the printed text, as a user reads
them. circuit, patch and attribute rank by `stats.top_parts` (mean |value| over pairs); `sae attribute` by
|mean margin|, its column printed; the audit's top parts by mean |total effect|."""

from __future__ import annotations

import html
import json
import math
import re

import numpy as np
import pytest

from rewardlens.cli import main
from rewardlens.data import save_pairs
from rewardlens.zoo import DEMO_PAIRS
from tests.helpers.tiny import PAIRS


def parse(text: str, column: str) -> list[dict[str, str]]:
    """The printed table whose header holds `column`: one dict per row, cells cut at the dashed rule's spans."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if column in line and i + 1 < len(lines)
              and set(lines[i + 1].replace(" ", "")) == {"-"})
    rule = lines[at + 1]
    spans, start = [], None
    for k, ch in enumerate(rule + " "):
        if ch == "-" and start is None:
            start = k
        elif ch != "-" and start is not None:
            spans.append((start, k))
            start = None
    head = [lines[at][a:b].strip() for a, b in spans]
    rows = []
    for line in lines[at + 2:]:
        if not line.strip():
            break
        rows.append(dict(zip(head, (line[a:b].strip() for a, b in spans))))
    return rows


def _number(cell: str) -> float:
    return math.nan if cell in ("-", "—", "") else float(cell)


def assert_sorted(rows: list[dict[str, str]], column: str, signed: str) -> list[float]:
    """Rows non-increasing in `column` (NaN last), the signed mean `signed` beside it; returns the column."""
    assert rows and column in rows[0] and signed in rows[0], rows[:1]
    got = [_number(r[column]) for r in rows]
    finite = [v for v in got if not math.isnan(v)]
    assert got[:len(finite)] == finite, got  # NaN only at the end
    assert all(a >= b for a, b in zip(finite, finite[1:])), got
    assert all(v >= 0 for v in finite)  # a size, never a signed number
    assert all(abs(_number(r[signed])) <= v + 1e-4 for r, v in zip(rows, got) if not math.isnan(v))  # |mean| ≤ mean|·|
    return got


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> str:
    return str(save_pairs(PAIRS[:3], tmp_path_factory.mktemp("ranked") / "pairs.jsonl"))


def _run(capsys, argv: list[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_circuit_edge_table_is_sorted_by_mean_abs_score(capsys, tiny_root, pairs_file):
    out = _run(capsys, ["circuit", str(tiny_root["llama"]), "--pairs", pairs_file, "--method", "eap", "--top", "8",
                        "--quiet"])
    rows = parse(out, "mean |score|")
    assert len(rows) == 8
    assert_sorted(rows, "mean |score|", "mean score")


def test_patch_table_is_sorted_by_mean_abs_effect_and_shows_it(capsys, tiny_root, pairs_file):
    argv = ["patch", str(tiny_root["llama"]), "--pairs", pairs_file, "--top", "8", "--quiet"]
    got = assert_sorted(parse(_run(capsys, argv), "mean |effect|"), "mean |effect|", "mean effect")
    # the column is the ranking statistic: mean over pairs of |effect|, from every part's per-pair effect
    full = json.loads(_run(capsys, [*argv, "--all-parts", "--json"]))
    effects = {name: [p["effects"][name] for p in full["pairs"]] for name in full["pairs"][0]["effects"]}
    want = sorted((float(np.mean(np.abs(v))) for v in effects.values()), reverse=True)[:8]
    np.testing.assert_allclose(got, want, atol=1e-4)  # printed to 4 decimals


def test_patch_at_neuron_level_is_sorted_too(capsys, tiny_root, pairs_file):
    out = _run(capsys, ["patch", str(tiny_root["llama"]), "--pairs", pairs_file, "--level", "neuron", "--neurons",
                        "top:6", "--top", "6", "--quiet"])
    assert_sorted(parse(out, "mean |effect|"), "mean |effect|", "mean effect")


@pytest.mark.parametrize("level", ["sublayer", "head"])
def test_attribute_table_is_sorted_by_mean_abs_margin(capsys, tiny_root, pairs_file, level):
    argv = ["attribute", str(tiny_root["llama"]), "--pairs", pairs_file, "--level", level, "--top", "8"]
    got = assert_sorted(parse(_run(capsys, argv), "mean |margin|"), "mean |margin|", "mean margin")
    full = json.loads(_run(capsys, [*argv, "--all-parts", "--json"]))
    parts = full["pairs"][0]["parts"]
    want = sorted((float(np.mean([abs(p["parts"][n]) for p in full["pairs"]])) for n in parts), reverse=True)[:8]
    np.testing.assert_allclose(got, want, atol=1e-4)


def html_tables(page: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every table of the report page: (headers, rows of cell texts)."""
    out = []
    for head, body in re.findall(r"<table><thead><tr>(.*?)</tr></thead><tbody>(.*?)</tbody></table>", page, re.S):
        headers = [html.unescape(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", head, re.S)]
        rows = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
                for r in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]
        out.append((headers, rows))
    return out


def test_audit_top_parts_table_and_the_reports_ranked_tables_are_sorted(capsys, tiny_root, tmp_path):
    pairs = str(save_pairs(DEMO_PAIRS[:4], tmp_path / "pairs.jsonl"))  # divergence needs 4 pairs
    out = _run(capsys, ["audit", str(tiny_root["llama"]), "--pairs", pairs, "--out", str(tmp_path / "audit"),
                        "--circuit", "--no-probes", "--no-concepts", "--no-tokens", "--quiet"])
    rows = parse(out, "mean |total effect|")
    assert len(rows) > 3
    assert_sorted(rows, "mean |total effect|", "total effect")
    # the page: every table marked "(ranked by)" is sorted by that column, which sits before the signed mean
    page = (tmp_path / "audit" / "report.html").read_text(encoding="utf-8")
    ranked = [(h, r) for h, r in html_tables(page) if any("(ranked by)" in x for x in h)]
    seen = set()
    for headers, body in ranked:
        k = next(i for i, x in enumerate(headers) if "(ranked by)" in x)
        seen.add(headers[k])
        got = [_number(r[k]) for r in body]
        assert got and all(a >= b for a, b in zip(got, got[1:])), (headers, got)
    # the circuit's kept edges, the estimands, the top heads, the divergence table and a pair's drill-down
    assert {"mean |score| (ranked by)", "mean |total| (ranked by)", "mean |margin contribution| (ranked by)",
            "mean |total effect| (ranked by)", "|total| (ranked by)"} <= seen, seen


def test_sae_attribute_table_is_sorted_by_its_ranking_column(capsys, tiny_root, pairs_file, tmp_path):
    model = str(tiny_root["llama"])
    _run(capsys, ["sae", "train", model, "--pairs", pairs_file, "--layer", "1", "--out", str(tmp_path / "sae"),
                  "--latents", "16", "--k", "2"])
    sae = next(p for p in (tmp_path / "sae").iterdir() if p.is_dir())
    out = _run(capsys, ["sae", "attribute", model, "--pairs", pairs_file, "--sae", str(sae), "--contexts", "0",
                        "--top", "6"])
    assert_sorted(parse(out, "|mean margin|"), "|mean margin|", "mean margin")
