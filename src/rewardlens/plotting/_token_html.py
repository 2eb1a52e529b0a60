"""The token view: text as coloured tokens, one owner for the notebook (`TokenAttribution._repr_html_`)
and the audit report's token section (audit/report/_tokens.py).

Each token's background is its value on a diverging scale symmetric around 0, white at 0: red raises
the side's reward, blue lowers it, full strength at ±`vmax`. Its position, text and value are in its
`title` (shown on hover); the read token is outlined; a template token (role header, special id,
separator) is grey and italic, its value on hover only, so the scaffolding neither hides the words nor
sets the colours. The text is the token's own decoding, escaped by `tag`: a `<script>` renders as text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ._html import Html, join, num, tag

GREY = "background:#ececec;color:#8a8a8a"
"""A template token's style in the content view: its value is on hover, not in the colour scale."""
UP, DOWN = (214, 39, 40), (31, 119, 180)
"""Full-scale colours of a token that raises (red) and lowers (blue) its side's reward."""
STRENGTH = 0.8
"""The largest |value| is mixed this far from white, so dark text stays readable on it."""
TOKEN_ROWS = 8
"""How many rows (four pairs) a notebook's token view shows; `TokenAttribution.to_frame()` holds all."""


def token_colour(value: float, vmax: float) -> str:
    """CSS colour of a contribution on the symmetric scale ±`vmax`: white at 0, red up, blue down."""
    if not math.isfinite(value) or vmax <= 0:
        return "rgb(255,255,255)"
    t = min(abs(value) / vmax, 1.0) * STRENGTH
    end = UP if value > 0 else DOWN
    r, g, b = (round(255 + (c - 255) * t) for c in end)
    return f"rgb({r},{g},{b})"


def token_spans(tokens: Sequence[str], values: Iterable[Any], read: int, vmax: float,
                roles: Sequence[str] | None = None) -> Html:
    """One row's tokens as `<span class="tok">` in a `<div class="toks">`: coloured by value (template
    tokens grey when `roles` are given), the read token classed `read`, each value on hover."""
    spans = []
    for pos, (text, v) in enumerate(zip(tokens, values)):
        role = "" if roles is None else f" · {roles[pos]}"
        where = f"position {pos}{' (read token)' if pos == read else ''}{role}"
        grey = roles is not None and roles[pos] == "template"
        cls = ("tok read" if pos == read else "tok") + (" tpl" if grey else "")
        style = GREY if grey else f"background:{token_colour(float(v), vmax)}"
        spans.append(tag("span", text, class_=cls, style=style,
                         title=f"{where} · {text!r} · {float(v):+.4g} reward units"))
    return tag("div", join(spans), class_="toks")


def token_scale(values: Sequence[Iterable[Any]], roles: Sequence[Sequence[str] | None]) -> float:
    """The scale's end `vmax`: the largest finite |value| over the rows' non-template tokens (0 when none)."""
    out = 0.0
    for vals, rol in zip(values, roles):
        for i, v in enumerate(vals):
            if math.isfinite(float(v)) and (rol is None or rol[i] != "template"):
                out = max(out, abs(float(v)))
    return out


def token_legend(vmax: float) -> Html:
    """The colour scale from −vmax (blue) through 0 (white) to +vmax (red), in reward units."""
    bar = tag("span", class_="bar", style=f"background:linear-gradient(to right,{token_colour(-vmax, vmax)},"
                                          f"rgb(255,255,255),{token_colour(vmax, vmax)})")
    return tag("div", tag("span", f"−{num(vmax, 3)}"), bar, tag("span", f"+{num(vmax, 3)}"),
               tag("span", " reward units per token: red raises that side's reward, blue lowers it; grey italic "
                           "tokens are the template's; hover a token for its value"), class_="legend")


class TokenRow(NamedTuple):
    """One row of a token view: its label, its header line (the owner's numbers, as text), its tokens,
    their values, the read position and each token's role (None: every token coloured)."""

    label: str
    header: str
    tokens: Sequence[str]
    values: Iterable[Any]
    read: int
    roles: Sequence[str] | None


def token_view(rows: Sequence[TokenRow], pairs: bool, limit: int = TOKEN_ROWS) -> Html:
    """The first `limit` rows on one colour scale: with `pairs`, rows (chosen, rejected) two by two side by
    side, one block per pair; otherwise one row under the other."""
    shown = list(rows[:limit])
    vmax = token_scale([r.values for r in shown], [r.roles for r in shown])

    def side(r: TokenRow) -> Html:
        return tag("div", tag("h5", r.header), token_spans(r.tokens, r.values, r.read, vmax, r.roles))

    if pairs:
        blocks = [tag("div", tag("div", join(side(r) for r in shown[i:i + 2]), class_="sides"), class_="tokpair")
                  for i in range(0, len(shown), 2)]
    else:
        blocks = [side(r) for r in shown]
    more = (tag("p", f"showing {len(shown)} of {len(rows)} rows (all of them: .to_frame())", class_="doc")
            if len(shown) < len(rows) else Html(""))
    return tag("div", token_legend(vmax), more, join(blocks), class_="tokens")


def token_rows(labels: Sequence[str], headers: Sequence[str], tokens: Sequence[Sequence[str]],
               values: Iterable[Any], reads: Iterable[Any], roles: Sequence[Sequence[str] | None]) -> list[TokenRow]:
    """`TokenRow`s from parallel per-row sequences."""
    return [TokenRow(*row) for row in zip(labels, headers, tokens, values, (int(r) for r in reads), roles)]
