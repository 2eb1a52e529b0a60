"""The report's token section on a hand-built `TokenAttribution`: every token once, in order, its value on
hover and its colour on one symmetric scale (checked against the colour computed by hand), markup in a
token shown as text, the pairs with the largest |margin| first and at most `cap` of them."""

from dataclasses import fields
from html.parser import HTMLParser

import numpy as np
import pytest

from rewardlens.audit.report import token_section
from rewardlens.data import row_labels
from rewardlens.errors import RewardLensError
from rewardlens.exact import TokenAttribution

AT_READ, CONSTANT = 0.5, -0.25


def attribution(texts: list[list[str]], values: list[list[float]]) -> TokenAttribution:
    """Rows interleaved chosen, rejected; read at each row's last token; reward = Σ values + at read + constant."""
    vals = [np.asarray(v, dtype=np.float64) for v in values]
    n = len(texts)
    known = dict(
        rows=row_labels(n, True), is_pairs=True, tokens=texts, token_ids=[list(range(len(t))) for t in texts],
        values=vals, by_layer=[v[:, None] for v in vals], per_head=[v[:, None, None] for v in vals],
        read_index=np.array([len(t) - 1 for t in texts]), at_read=np.full(n, AT_READ), constant=np.full(n, CONSTANT),
        reward=np.array([v.sum() + AT_READ + CONSTANT for v in vals]))
    # One layer with one head: the breakdowns equal the totals. Fields with defaults keep them.
    return TokenAttribution(**{f.name: known[f.name] for f in fields(TokenAttribution) if f.name in known})


class Tokens(HTMLParser):
    """Per shown pair (in page order): its id, and per side the spans' (class, style, title, text)."""

    def __init__(self, text: str):
        super().__init__()
        self.pairs: list[tuple[str, list[list[tuple[str, str, str, str]]]]] = []
        self.scripts, self._span = 0, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        elif tag == "div" and a.get("class") == "tokpair":
            self.pairs.append((a["data-pair"], []))
        elif tag == "div" and a.get("class") == "toks":
            self.pairs[-1][1].append([])
        elif tag == "span" and "tok" in (a.get("class") or "").split():
            self._span = [a["class"], a["style"], a["title"], ""]

    def handle_data(self, data):
        if self._span is not None:
            self._span[3] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._span is not None:
            self.pairs[-1][1][-1].append(tuple(self._span))
            self._span = None


def rgb(value: float, vmax: float) -> str:
    """The colour by hand: white mixed 80% of the way to red (214, 39, 40) or blue (31, 119, 180) at |value| = vmax."""
    t = 0.8 * min(abs(value) / vmax, 1.0)
    end = (214, 39, 40) if value > 0 else (31, 119, 180)
    return "rgb({},{},{})".format(*(round(255 + (c - 255) * t) for c in end))


TEXTS = [["Sure", ".", " <script>", "alert(1)", "</script>"], ["No", " & ", "bye"],
         ["a", "b"], ["c"],
         ["x", "<b>y</b>"], ["z", "w"]]
VALUES = [[0.5, -1.0, 2.0, 0.0, -0.5], [0.25, 4.0, -4.0],
          [0.1, 0.1], [0.2],
          [-0.3, 0.3], [1.0, -1.0]]


def test_every_token_once_in_order_with_its_value_and_colour():
    t = attribution(TEXTS, VALUES)
    margins = np.array([-3.0, 0.0, 1.0])
    page = Tokens(token_section(t, ["p0", "p1", "p2"], margins))
    assert [pid for pid, _ in page.pairs] == ["p0", "p2", "p1"]  # largest |margin| first
    vmax = 4.0  # the largest |value| over every shown token
    rows = {"p0": (0, 1), "p1": (2, 3), "p2": (4, 5)}
    for pid, sides in page.pairs:
        for side, row in zip(sides, rows[pid]):
            assert [s[3] for s in side] == TEXTS[row]
            for pos, (cls, style, title, _) in enumerate(side):
                value = VALUES[row][pos]
                want = rgb(value, vmax) if value else "rgb(255,255,255)"
                assert style == f"background:{want}"
                assert f"{value:+.4g} reward units" in title and f"position {pos}" in title
                assert ("read" in cls.split()) == (pos == len(TEXTS[row]) - 1)
    assert page.scripts == 0  # '<script>' in a token is text


def test_markup_in_a_token_is_escaped_and_the_split_is_stated():
    t = attribution(TEXTS, VALUES)
    html = token_section(t, ["p0", "p1", "p2"], np.array([-3.0, 0.0, 1.0]))
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;b&gt;y&lt;/b&gt;" in html
    assert " &amp; " in html
    # chosen of p0: reward 1.25 = Σ tokens 1 + at read 0.5 + constant -0.25
    assert "reward 1.25 = Σ tokens 1 + at read 0.5 + constant -0.25" in html
    assert ">-4<" in html and ">+4<" in html  # the legend's ends, in reward units


def test_many_pairs_show_the_largest_margins_up_to_the_cap():
    t = attribution(TEXTS, VALUES)
    page = Tokens(token_section(t, ["p0", "p1", "p2"], np.array([0.1, -5.0, 2.0]), cap=2))
    assert [pid for pid, _ in page.pairs] == ["p1", "p2"]
    assert "Showing the 2 pairs with the largest |margin| of 3" in token_section(t, ["p0", "p1", "p2"],
                                                                                np.array([0.1, -5.0, 2.0]), cap=2)


def test_rows_that_are_not_the_audits_pairs_are_refused():
    t = attribution(TEXTS, VALUES)
    with pytest.raises(RewardLensError, match="6 rows but the audit names 2 pairs"):
        token_section(t, ["p0", "p1"], np.array([1.0, 2.0]))


def test_content_view_greys_the_template_scales_by_the_content_and_states_its_share():
    """With token roles (0 template, 1 prompt, 2 response) the template's tokens are grey, the colour scale is set
    by the prompt's and response's tokens alone, and each header splits Σ tokens by role with shares."""
    from dataclasses import replace

    roles = [[0, 1, 0, 2, 0], [2, 0, 0], [1, 2], [2], [1, 2], [0, 2]]
    t = replace(attribution(TEXTS, VALUES), roles=[np.array(r, dtype=np.int8) for r in roles])
    html = token_section(t, ["p0", "p1", "p2"], np.array([-3.0, 0.0, 1.0]))
    content = [abs(v) for vs, rs in zip(VALUES, roles) for v, r in zip(vs, rs) if r]
    vmax = max(content)
    assert vmax == 1.0  # the template's ±4 and 2 do not set the scale
    page = Tokens(html)
    rows = {"p0": (0, 1), "p1": (2, 3), "p2": (4, 5)}
    for pid, sides in page.pairs:
        for side, row in zip(sides, rows[pid]):
            for pos, (cls, style, title, _) in enumerate(side):
                value, template = VALUES[row][pos], roles[row][pos] == 0
                assert ("tpl" in cls.split()) == template
                want = "background:#ececec;color:#8a8a8a" if template else \
                    f"background:{rgb(value, vmax) if value else 'rgb(255,255,255)'}"
                assert style == want and f"{value:+.4g} reward units" in title
    # chosen of p0: reward 1.25 = response 0 + prompt -1 + template (0.5 + 2 - 0.5) + at read 0.5 + constant -0.25
    reward = sum(VALUES[0]) + AT_READ + CONSTANT
    template = VALUES[0][0] + VALUES[0][2] + VALUES[0][4]
    assert f"template (3 tokens) {template:g} ({100 * template / reward:+.1f} %)" in html
    assert f"prompt {VALUES[0][1]:g} ({100 * VALUES[0][1] / reward:+.1f} %)" in html
    assert "Content view:" in html and "exact direct split" in html and "total ≈" in html
