"""The findings that open the report and `rewardlens audit`'s output (issue 42, item 5): every number a sentence
quotes is parsed back from the page and the terminal and checked against the audit's own results, recomputed
here the naive way (accuracy and its Wilson interval from the margins, the top parts from the per-pair arrays,
the probe effect from the item deltas); the demo's page says it audits a planted organism and names the plant;
the seed paper is named with its arXiv id; and under `MIN_PAIRS` pairs the statistical claims say
"too few pairs to say"."""

import contextlib
import html
import io
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import rewardlens as rl
from rewardlens.audit import Plan, audit
from rewardlens.audit.report import findings_text, summary, write_report
from rewardlens.audit.report._findings import MIN_PAIRS, organism
from rewardlens.cli import main
from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir

REPO = Path(__file__).resolve().parents[2]
ARXIV = "arXiv:2604.26130"
TITLE = "reward-lens: A Mechanistic Interpretability Library for Reward Models"
NUMBER = r"[+\-−]?\d+(?:\.\d+)?(?:e[+\-]\d+)?"
# What the CLI runs when given no flags but these (the plan its stored results are under).
CLI_PLAN = Plan(concepts=False, tokens=False)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`rewardlens audit` on the demo (no concepts, no tokens: the findings do not quote them), its printed
    output, and the audit read back from the store it wrote (nothing recomputed)."""
    out = tmp_path_factory.mktemp("demo") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["audit", "--out", str(out), "--no-concepts", "--no-tokens", "--quiet"]) == 0
    model = rl.load(str(demo_model_dir()))
    result = audit(model, AUDIT_PAIRS, store=out / "results.sqlite", plan=CLI_PLAN)
    page = (out / "report.html").read_text(encoding="utf-8")
    numbers = json.loads((out / "numbers.json").read_text(encoding="utf-8"))
    return {"audit": result, "printed": printed.getvalue(), "page": page, "numbers": numbers, "out": out}


class _Spans(HTMLParser):
    """Each `span.finding` of the page: its data attributes and its text (the strength badge dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[dict] = []
        self.depth = 0
        self.badge = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and a.get("class") == "finding":
            self.found.append({**a, "text": ""})
            self.depth = 1
        elif self.depth and tag == "span":
            self.depth += 1
            self.badge = a.get("class") == "strength"

    def handle_endtag(self, tag):
        if self.depth and tag == "span":
            self.depth -= 1
            self.badge = False

    def handle_data(self, data):
        if self.depth and not self.badge:
            self.found[-1]["text"] += data


def spans(page: str) -> list[dict]:
    parser = _Spans()
    parser.feed(page)
    for s in parser.found:
        s["text"] = s["text"].strip()
    return parser.found


def numbers_in(text: str) -> list[float]:
    return [float(x.replace("−", "-")) for x in re.findall(NUMBER, text)]


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval, its textbook formula."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def close(printed: float, value: float, digits: int = 3) -> bool:
    """`printed` is `value` to the printed precision (`digits` significant figures, or 2 decimals)."""
    return abs(printed - value) <= max(0.5 * 10 ** (math.floor(math.log10(abs(value) or 1)) - digits + 1), 0.005)


def by_kind(found: list[dict], kind: str) -> list[dict]:
    return [s for s in found if s["data-kind"] == kind]


def test_the_page_opens_with_the_findings(demo):
    page = demo["page"]
    assert page.index('<section id="findings">') < page.index('<section id="summary">')
    assert len(spans(page)) == len(demo["numbers"]["findings"]["claims"])


def test_the_accuracy_sentence_quotes_the_margins(demo):
    a = demo["audit"]
    margin = a.lens.reward[0::2] - a.lens.reward[1::2]
    n, k = len(margin), int((margin > 0).sum())
    lo, hi = wilson(k, n)
    (s,) = by_kind(spans(demo["page"]), "accuracy")
    assert float(s["data-number"]) == k / n and float(s["data-n-pairs"]) == n
    assert float(s["data-lo"]) == pytest.approx(lo) and float(s["data-hi"]) == pytest.approx(hi)
    # The demo organism prefers the agreeing (rejected) side of every built-in pair.
    assert k == 0 and s["text"].startswith(f"The RM prefers the rejected side on {n} of {n} pairs")
    acc, shown_lo, shown_hi = numbers_in(s["text"].split("accuracy", 1)[1])[:3]
    assert (acc, shown_lo, shown_hi) == (round(k / n, 2), round(lo, 2), round(hi, 2))
    assert s["data-strength"] == "measured" and hi < 0.5


def test_the_probe_sentence_quotes_the_item_deltas(demo):
    p = demo["audit"].probes
    (s,) = [s for s in by_kind(spans(demo["page"]), "probe") if s["data-subject"]]
    i = p.axes.index(s["data-subject"])
    delta = p.delta[:, i][np.isfinite(p.delta[:, i])]
    assert s["data-subject"] == "sycophancy" and p.flagged[i]  # the plant, found by the probes
    assert float(s["data-number"]) == pytest.approx(delta.mean()) and int(s["data-n-pairs"]) == len(delta)
    mean, lo, hi = numbers_in(s["text"].split(":", 1)[1])[:3]
    assert close(mean, delta.mean()) and close(lo, p.ci_low[i]) and close(hi, p.ci_high[i])
    assert lo <= delta.mean() <= hi and "flagged" in s["text"]


def test_the_part_sentences_name_the_naive_top_parts(demo):
    a = demo["audit"]
    heads = a.heads.values[0::2] - a.heads.values[1::2]  # per pair, per part: chosen − rejected
    written = int(np.argmax(np.abs(heads).mean(0)))
    total = a.faithfulness.total
    carried = int(np.argmax(np.abs(total).mean(0)))
    found = spans(demo["page"])
    (w,) = by_kind(found, "written_by")
    (c,) = by_kind(found, "carried_by")
    assert w["data-subject"] == a.heads.names[written] and c["data-subject"] == a.faithfulness.names[carried]
    for s, values in ((w, heads[:, written]), (c, total[:, carried])):
        assert float(s["data-number"]) == pytest.approx(values.mean())
        shown = numbers_in(s["text"].split(":", 1)[1])
        assert close(shown[0], values.mean()) and close(shown[1], float(s["data-lo"])) \
            and close(shown[2], float(s["data-hi"]))
        assert float(s["data-lo"]) < values.mean() < float(s["data-hi"]) < 0  # the preference for the rejected side
    margin = a.lens.reward[0::2] - a.lens.reward[1::2]
    assert close(numbers_in(w["text"].split("mean margin of", 1)[1])[0], margin.mean())


def test_the_exact_sentences_quote_the_closure_and_parity(demo):
    a = demo["audit"]
    worst = max(float(np.abs(r.reward - r.values.sum(1) - r.constant).max()) for r in (a.sublayers, a.heads))
    (closure,) = by_kind(spans(demo["page"]), "closure")
    assert closure["data-strength"] == "exact" and float(closure["data-number"]) >= worst
    assert float(numbers_in(closure["text"].split("within", 1)[1])[0]) == pytest.approx(
        float(closure["data-number"]), rel=0.06)
    (parity,) = by_kind(spans(demo["page"]), "parity")
    assert parity["data-strength"] == "exact" and "equal the model's own forward" in parity["text"]


def test_the_terminal_prints_the_same_sentences_first(demo):
    printed, found = demo["printed"], spans(demo["page"])
    assert printed.index("findings (") < printed.index("pair accuracy")
    block = printed.split("findings (", 1)[1].split("\n\n", 1)[0]
    for s in found:
        assert f"[{s['data-strength']}] {html.unescape(s['text'])}" in block
    assert findings_text(demo["numbers"]["findings"]) in printed


def test_the_demo_page_says_it_audits_a_planted_organism(demo):
    record = json.loads((demo_model_dir() / "organism.json").read_text())
    text = html.unescape(demo["page"])
    assert "planted model organism, 'sycophancy'" in text and record["rule"] in text
    assert "planted model organism" in demo["printed"] and record["rule"] in demo["printed"]
    assert "chosen corrects it, rejected agrees" in text  # the demo's pairs, in the provenance line


def test_any_organism_says_what_was_planted_and_a_plain_model_says_nothing(tmp_path):
    (tmp_path / "organism.json").write_text(json.dumps({"organism": "mine", "strength": 0.5, "seed": 3,
                                                        "rule": "the chosen response is in French"}))
    line = organism({"model_path": str(tmp_path)})
    assert "planted model organism, 'mine'" in line and "the chosen response is in French" in line
    assert organism({"model_path": str(tmp_path / "nowhere")}) is None and organism({"model_path": None}) is None


def test_the_seed_paper_is_named_with_its_arxiv_id(demo):
    text = html.unescape(re.sub(r"<[^>]+>", " ", demo["page"]))
    assert text.count("seed paper") >= 2
    for m in re.finditer("seed paper", text):  # each mention names it within its sentence
        assert ARXIV in text[m.start(): m.start() + 200] and TITLE in text[m.start(): m.start() + 200]
    assert demo["numbers"]["faithfulness"]["seed_statistic"]["paper_name"].endswith(f"({ARXIV})")
    assert ARXIV in demo["printed"]
    for doc in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        body = doc.read_text(encoding="utf-8")
        if "seed paper" in body:
            assert ARXIV in body, f"{doc.name} mentions the seed paper without its arXiv id"


def test_under_the_minimum_the_statistical_claims_say_too_few_pairs():
    model = rl.load(str(demo_model_dir()))
    few = audit(model, AUDIT_PAIRS[:3], plan=Plan(probes=False, concepts=False, divergence=False, tokens=False,
                                                   circuit=True))
    claims = {c["kind"]: c for c in summary(few)["findings"]["claims"]}
    assert 3 < MIN_PAIRS
    for kind in ("accuracy", "written_by", "carried_by", "agreement", "circuit"):
        assert claims[kind]["strength"] == "too few pairs" and claims[kind]["n_pairs"] == 3
        assert claims[kind]["claim"].startswith(f"too few pairs to say (3 of the {MIN_PAIRS} needed)")
    assert claims["circuit"]["number"] == few.circuit.share  # the circuit's own per-pair share, quoted
    assert f"carries {few.circuit.share:.1%} of each pair's own clean margin" in claims["circuit"]["claim"]
    assert claims["closure"]["strength"] == "exact"  # an identity needs no minimum
    assert "probe" not in claims


def test_the_page_renders_the_findings_of_a_summary(demo, tmp_path):
    """write_report and summary agree: the page's spans are the summary's claims, in order."""
    page = write_report(demo["audit"], tmp_path / "again").read_text(encoding="utf-8")
    claims = summary(demo["audit"])["findings"]["claims"]
    assert [s["data-kind"] for s in spans(page)] == [c["kind"] for c in claims]


def test_every_mention_of_the_seed_paper_on_a_page_with_subsets_names_it(demo, tmp_path):
    from dataclasses import replace

    subsets = ["chat", "safety"] * (len(demo["audit"].pair_ids) // 2)
    page = write_report(replace(demo["audit"], subsets=subsets), tmp_path / "subsets").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert text.count("seed paper") >= 3  # the summary, the patching section and the subsets section
    for m in re.finditer("seed paper", text):
        assert ARXIV in text[m.start(): m.start() + 200]


def test_no_fragile_probe_flag_is_headlined(demo):
    p = demo["audit"].probes
    probe = by_kind(spans(demo["page"]), "probe")
    headlined = {s["data-subject"] for s in probe if s["data-strength"] == "measured" and s["data-subject"]}
    assert headlined == {a for a, f, w in zip(p.axes, p.flagged, p.fragile) if f and not w}
    fragile = [a for a, w in zip(p.axes, p.fragile) if w]
    named = [s for s in probe if s["data-strength"] == "fragile"]
    if fragile:  # one sentence names exactly the fragile axes, set apart
        (s,) = named
        listed = s["text"].split("no finding:", 1)[1].split("(", 1)[0]
        assert sorted(a.strip() for a in listed.split(",")) == sorted(fragile)
    else:
        assert not named
