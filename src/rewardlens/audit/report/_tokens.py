"""The token section: each shown pair's chosen and rejected text side by side, every token's
background coloured by its exact direct contribution to that side's reward.

The text is the tokenizer's own decoding of each token (`TokenAttribution.tokens`), HTML-escaped, so a
response holding markup or a `<script>` renders as text. Colours are diverging and symmetric around 0
(red raises the side's reward, blue lowers it) on one scale for every shown pair, with a legend in
reward units; each token's position and value are in its `title` (shown on hover).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...data import SIDES, pair_of
from ...errors import RewardLensError
from .._whole import TOKEN_PAIRS, shown_pairs
from ._html import Html, e, num

if TYPE_CHECKING:
    from ...exact import TokenAttribution

UP, DOWN = (214, 39, 40), (31, 119, 180)
"""Full-scale colours of a token that raises (red) and lowers (blue) its side's reward."""
STRENGTH = 0.8
"""The largest |value| is mixed this far from white, so dark text stays readable on it."""


def colour(value: float, vmax: float) -> str:
    """CSS colour of a contribution on the symmetric scale ±`vmax`: white at 0, red up, blue down."""
    if not np.isfinite(value) or vmax <= 0:
        return "rgb(255,255,255)"
    t = min(abs(value) / vmax, 1.0) * STRENGTH
    end = UP if value > 0 else DOWN
    r, g, b = (round(255 + (c - 255) * t) for c in end)
    return f"rgb({r},{g},{b})"


def _side(tokens: list[str], values: np.ndarray, read: int, vmax: float) -> Html:
    spans = []
    for pos, (text, v) in enumerate(zip(tokens, values)):
        title = f"position {pos}{' (read token)' if pos == read else ''} · {text!r} · {float(v):+.4g} reward units"
        cls = "tok read" if pos == read else "tok"
        spans.append(f'<span class="{cls}" style="background:{colour(float(v), vmax)}" title="{e(title)}">'
                     f"{e(text)}</span>")
    return Html('<div class="toks">' + "".join(spans) + "</div>")


def legend(vmax: float) -> Html:
    """The colour scale: −vmax (blue) through 0 (white) to +vmax (red), in reward units."""
    return Html(f'<div class="legend"><span>{e(num(-vmax))}</span><span class="bar" style="background:linear-gradient'
                f"(to right,{colour(-vmax, vmax)},rgb(255,255,255),{colour(vmax, vmax)})\"></span>"
                f"<span>+{e(num(vmax))}</span><span> reward units per token (red raises that side's reward, "
                "blue lowers it; hover a token for its number)</span></div>")


def token_section(tokens: TokenAttribution, pair_ids: Sequence[str], margins: np.ndarray,
                  cap: int = TOKEN_PAIRS, subsets: Sequence[str] | None = None) -> Html:
    """Chosen and rejected side by side for the pairs with the largest |margin| (all when at most `cap`).

    `tokens` holds both sides of every pair (rows interleaved); `pair_ids` and `margins` [n] name and
    order the pairs; `subsets` [n], when given, marks each pair's block (`data-subset`) for the page's
    subset selector. Each side's header states the exact split: reward = Σ tokens + at read + constant."""
    n = len(pair_ids)
    if not tokens.is_pairs or len(tokens.rows) != 2 * n:
        raise RewardLensError(f"the token attribution holds {len(tokens.rows)} rows but the audit names {n} pairs; "
                              "compute it on the audit's own pairs (rewardlens.tokens(model, pairs)) so each pair "
                              "has its chosen and rejected row")
    shown = shown_pairs(np.asarray(margins, dtype=np.float64), cap)
    row = {pair_of(r): r for r in range(len(tokens.rows))}  # (pair, side) → row of the interleaved layout
    values = {r: np.asarray(tokens.values[r], dtype=np.float64) for i in shown for r in (row[i, s] for s in SIDES)}
    vmax = max((float(np.abs(v[np.isfinite(v)]).max()) for v in values.values() if np.isfinite(v).any()),
               default=0.0)
    blocks = []
    for i in shown:
        cols = []
        for s in SIDES:
            r = row[i, s]
            head = (f"<h4>{e(s)}: reward {e(num(tokens.reward[r]))} = Σ tokens {e(num(values[r].sum()))} + at read "
                    f"{e(num(tokens.at_read[r]))} + constant {e(num(tokens.constant[r]))}</h4>")
            cols.append(f"<div>{head}{_side(list(tokens.tokens[r]), values[r], int(tokens.read_index[r]), vmax)}</div>")
        tag = "" if subsets is None else f' data-subset="{e(subsets[i])}"'
        blocks.append(f'<div class="tokpair" data-pair="{e(pair_ids[i])}"{tag}><h3>pair {e(pair_ids[i])} · margin '
                      f'{e(num(margins[i]))}</h3><div class="sides">{"".join(cols)}</div></div>')
    more = (f"<p>Showing the {len(shown)} pairs with the largest |margin| of {n}; their tokens are in "
            "<code>tokens.parquet</code>.</p>" if len(shown) < n else "")
    return Html(legend(vmax) + more + "".join(blocks))
