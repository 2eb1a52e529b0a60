"""The feature page in headless Chromium: it renders every card, holds no external URL, shows a `<script>` in the
corpus as text, and sorts and searches (driven through the URL hash; the page writes what it shows to a data-
attribute of <body>, read back from the DOM dump). And `rewardlens sae report` writes it."""

import math
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import pytest

import rewardlens as rl
from rewardlens.cli import main
from rewardlens.data import Pair, save_pairs
from rewardlens.sae import SAEConfig, TopKSAE, attribute_features, feature_report, write_feature_page
from rewardlens.zoo import DEMO_PAIRS
from tests.helpers.browser import dom

EVIL = '<script>document.body.setAttribute("data-pwned","1")</script><img src=x onerror="alert(1)">'
AXIS = "<b>bold</b> & axis"


def _chromium(page: str, profile: Path) -> str:
    """The DOM of `page` (a file URI, with a hash) after its scripts ran, from headless Chromium."""
    return dom(page, profile, what="the feature page", budget_ms=5000)


class _Dom(HTMLParser):
    """The parts of a DOM dump the tests read: body attributes, elements by tag, the text of each <th>."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.headers: list[str] = []
        self._in_th = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if tag == "body":
            self.body = a
        self._in_th = tag == "th" or (self._in_th and tag != "td")
        if tag == "th":
            self.headers.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "th":
            self._in_th = False

    def handle_data(self, data: str) -> None:
        if self._in_th:
            self.headers[-1] += data

    def count(self, tag: str) -> int:
        return sum(t == tag for t, _ in self.tags)


@pytest.fixture(scope="module")
def page(tiny_root, tmp_path_factory):
    model = rl.load(str(tiny_root["llama"]))
    pairs = [Pair("Show me some markup.", EVIL, "No."), *DEMO_PAIRS[:4]]
    sae = TopKSAE(model.d_model, SAEConfig(expansion_factor=4, k=8), seed=3)
    att = attribute_features(model, sae, pairs, layer=0)
    # The contexts come from markup-laden text only, so the page must show some of it.
    corpus = [Pair(EVIL, EVIL, f"{EVIL} {EVIL}"), *pairs]
    axis = [float(i % 3) for i in range(2 * len(corpus))]
    report = feature_report(model, sae, att, corpus, top=6, n_contexts=3, window=6,
                            axes={AXIS: axis})
    path = write_feature_page(report, tmp_path_factory.mktemp("page") / "features.html", title="features <i>x</i>")
    return report, path


def _order(dom: _Dom) -> list[int]:
    return [int(f) for f in dom.body["data-order"].split(",") if f]


def test_the_page_renders_every_card_offline_and_shows_markup_as_text(page, tmp_path):
    report, path = page
    text = path.read_text(encoding="utf-8")
    assert "http" not in text and "url(" not in text and "@import" not in text
    assert "<script>document" not in text and "<img" not in text
    shown = [c.text for card in report.cards for c in card.contexts]
    assert any("<" in t or ">" in t for t in shown)  # the markup is in the contexts, and so in the page as text
    dom = _Dom(_chromium(path.as_uri(), tmp_path / "profile"))
    cards = [a for t, a in dom.tags if t == "section" and "card" in a.get("class", "")]
    assert [int(a["data-feature"]) for a in cards] == report.features.tolist()
    assert _order(dom) == report.features.tolist()  # the script ran: table order as built
    assert dom.count("script") == 1 and dom.count("img") == 0 and dom.count("b") == 0 and dom.count("i") == 0
    assert "data-pwned" not in dom.body
    assert not [a for _, a in dom.tags if "src" in a or "href" in a]  # nothing is fetched
    assert f"ρ {AXIS}" in dom.headers
    tokens = [a for t, a in dom.tags if t == "span" and a.get("class", "").startswith("tok")]
    assert len(tokens) == sum(len(c.tokens) for card in report.cards for c in card.contexts) > 0
    peak = [a for a in tokens if a["class"] == "tok peak"]
    assert len(peak) == sum(len(card.contexts) for card in report.cards)
    for a in peak:  # the firing token: coloured, its value in the title
        assert "activation" in a["title"] and not a["style"].endswith(",0.000)")


def test_sorting_and_search_from_the_url_hash(page, tmp_path):
    report, path = page
    dom = _Dom(_chromium(path.as_uri() + "#sort=frequency&dir=asc", tmp_path / "sort"))
    want = sorted(report.cards, key=lambda c: c.frequency)  # stable, as the browser's sort is
    assert _order(dom) == [c.feature for c in want] != report.features.tolist()
    dom = _Dom(_chromium(path.as_uri() + "#sort=difference&dir=desc", tmp_path / "sort2"))
    finite = sorted((c for c in report.cards if math.isfinite(c.difference)), key=lambda c: -c.difference)
    assert _order(dom)[:len(finite)] == [c.feature for c in finite]
    term = max(report.cards.cards[2].contexts[0].tokens, key=lambda t: len(t.strip())).strip().lower()
    dom = _Dom(_chromium(path.as_uri() + f"#sort=feature&dir=asc&q={quote(term)}", tmp_path / "search"))
    hits = [c.feature for c in report.cards
            if term in " ".join([f"feature {c.feature}", *(x.text for x in c.contexts), c.note]).lower()]
    assert report.cards.cards[2].feature in hits and 0 < len(hits) < len(report.cards)
    assert _order(dom) == sorted(hits)
    hidden = {int(a["data-feature"]) for t, a in dom.tags if t == "section" and "hidden" in a}
    assert hidden == set(report.features.tolist()) - set(hits)


def test_cli_report_writes_the_page(capsys, tmp_path, tiny_root):
    model = str(tiny_root["llama"])
    TopKSAE(rl.load(model).d_model, SAEConfig(expansion_factor=4, k=8), seed=1).save(tmp_path / "saes" / "layers.0")
    pairs_file = str(save_pairs([Pair("Show me some markup.", EVIL, "No."), *DEMO_PAIRS[:3]], tmp_path / "p.jsonl"))
    out = tmp_path / "features.html"
    args = ["sae", "report", model, "--sae", str(tmp_path / "saes" / "layers.0"), "--pairs", pairs_file, "--top", "3",
            "--sae-any-model"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote 3 feature cards to {out}" in printed and "strongest context" in printed
    assert out.read_text(encoding="utf-8").count('<section class="card"') == 3
    assert main([*args, "--out", str(tmp_path)]) == 2
    assert "--out page is a folder, not a file" in capsys.readouterr().err
