"""The token section: each shown pair's chosen and rejected text side by side, every token's
background coloured by its exact direct contribution to that side's reward.

The content view, by default (docs/tokens.md): only the prompt's and the response's own tokens are
coloured, on a scale set by them alone, and the template's tokens (role headers, special ids,
separators; model/_roles.py) are greyed and grouped into one term of each side's header with its share
of the reward, so a template that carries most of the direct split neither hides the words nor sets the
colours. An attribution without token roles (stored before they existed) colours every token.

The text is the tokenizer's own decoding of each token (`TokenAttribution.tokens`), HTML-escaped, so a
response holding markup or a `<script>` renders as text. Colours are diverging and symmetric around 0
(red raises the side's reward, blue lowers it) on one scale for every shown pair, with a legend in
reward units; each token's position and value are in its `title` (shown on hover). The spans and their
colours are the token view's (`rewardlens.plotting.token_spans`), the one a notebook shows too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...data import SIDES, pair_of
from ...errors import RewardLensError
from ...plotting import token_colour as colour
from ...plotting import token_spans
from .._whole import TOKEN_PAIRS, shown_pairs
from ._html import Html, e, num

if TYPE_CHECKING:
    from ...exact import TokenAttribution

def legend(vmax: float) -> Html:
    """The colour scale: −vmax (blue) through 0 (white) to +vmax (red), in reward units."""
    return Html(f'<div class="legend"><span>{e(num(-vmax))}</span><span class="bar" style="background:linear-gradient'
                f"(to right,{colour(-vmax, vmax)},rgb(255,255,255),{colour(vmax, vmax)})\"></span>"
                f"<span>+{e(num(vmax))}</span><span> reward units per token (red raises that side's reward, "
                "blue lowers it; hover a token for its number)</span></div>")


def _share(part: float, reward: float) -> str:
    return f" ({100 * part / reward:+.1f} %)" if reward != 0 and np.isfinite(part / reward) else ""


def _header(tokens: TokenAttribution, r: int, side: str, total: float) -> str:
    """A side's exact split: reward = Σ tokens + at read + constant; in the content view Σ tokens is
    split into the response's, the prompt's and the template's, each with its share of the reward."""
    reward = float(tokens.reward[r])
    if tokens.roles is None:
        return (f"<h4>{e(side)}: reward {e(num(reward))} = Σ tokens {e(num(total))} + at read "
                f"{e(num(tokens.at_read[r]))} + constant {e(num(tokens.constant[r]))}</h4>")
    g, n = tokens.groups(r), tokens.role_names(r)
    terms = [f"response {num(g['response'])}{_share(g['response'], reward)}",
             f"prompt {num(g['prompt'])}{_share(g['prompt'], reward)}",
             f"template ({n.count('template')} tokens) {num(g['template'])}{_share(g['template'], reward)}",
             f"at read {num(g['at_read'])}{_share(g['at_read'], reward)}", f"constant {num(g['constant'])}"]
    return f"<h4>{e(side)}: reward {e(num(reward))} = {e(' + '.join(terms))}</h4>"


CAPTION = ("Content view: only the prompt's and the response's own tokens are coloured, on a scale set by them; the "
           "template's tokens (role headers, special ids, separators, the read token when the template writes it) are "
           "grey and summed into the template term of each side's header, with its share of the reward. The values "
           "are the exact direct split, which answers 'which words is this reward read from'; what replacing a word "
           "would change (its total effect) is the first-order column total ≈ of rewardlens tokens, or a patch.")
"""Which question the section's numbers answer, under the legend (docs/tokens.md says the same)."""


def token_section(tokens: TokenAttribution, pair_ids: Sequence[str], margins: np.ndarray,
                  cap: int = TOKEN_PAIRS, subsets: Sequence[str] | None = None) -> Html:
    """Chosen and rejected side by side for the pairs with the largest |margin| (all when at most `cap`).

    `tokens` holds both sides of every pair (rows interleaved); `pair_ids` and `margins` [n] name and
    order the pairs; `subsets` [n], when given, marks each pair's block (`data-subset`) for the page's
    subset selector. Each side's header states the exact split: reward = Σ tokens + at read + constant,
    Σ tokens split into response, prompt and template (with shares) in the content view."""
    n = len(pair_ids)
    if not tokens.is_pairs or len(tokens.rows) != 2 * n:
        raise RewardLensError(f"the token attribution holds {len(tokens.rows)} rows but the audit names {n} pairs; "
                              "compute it on the audit's own pairs (rewardlens.tokens(model, pairs)) so each pair "
                              "has its chosen and rejected row")
    shown = shown_pairs(np.asarray(margins, dtype=np.float64), cap)
    row = {pair_of(r): r for r in range(len(tokens.rows))}  # (pair, side) → row of the interleaved layout
    values = {r: np.asarray(tokens.values[r], dtype=np.float64) for i in shown for r in (row[i, s] for s in SIDES)}
    roles = {r: tokens.role_names(r) for r in values} if tokens.roles is not None else {}
    scaled = {r: v[[x != "template" for x in roles[r]]] if roles else v for r, v in values.items()}
    vmax = max((float(np.abs(v[np.isfinite(v)]).max()) for v in scaled.values() if np.isfinite(v).any()),
               default=0.0)
    blocks = []
    for i in shown:
        cols = []
        for s in SIDES:
            r = row[i, s]
            head = _header(tokens, r, s, float(values[r].sum()))
            side = token_spans(list(tokens.tokens[r]), values[r], int(tokens.read_index[r]), vmax, roles.get(r))
            cols.append(f"<div>{head}{side}</div>")
        tag = "" if subsets is None else f' data-subset="{e(subsets[i])}"'
        blocks.append(f'<div class="tokpair" data-pair="{e(pair_ids[i])}"{tag}><h3>pair {e(pair_ids[i])} · margin '
                      f'{e(num(margins[i]))}</h3><div class="sides">{"".join(cols)}</div></div>')
    more = (f"<p>Showing the {len(shown)} pairs with the largest |margin| of {n}; their tokens are in "
            "<code>tokens.parquet</code>.</p>" if len(shown) < n else "")
    caption = f'<p class="how">{e(CAPTION)}</p>' if roles else ""
    return Html(legend(vmax) + caption + more + "".join(blocks))
