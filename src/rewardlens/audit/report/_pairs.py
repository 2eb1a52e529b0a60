"""The scores table, one row per pair, and each pair's drill-down: its top parts with their patching
effects, and its tokens that add most to each side's reward.

Every number is read off a stored per-pair result (`Faithfulness` rows, `TokenAttribution` rows); the
parts are ranked by the result's own rule (`Faithfulness.top` over that one pair), the tokens by
`TokenAttribution.top`, the rows collapsed to the pairs with the largest |margin| (`shown_pairs`, the
rule the token section follows). Nothing here runs the model.
"""

from __future__ import annotations

import numpy as np

from ...data import SIDES, pair_of
from .._runner import Audit
from .._whole import shown_pairs
from ._groups import depths, labels
from ._html import TOP_ROWS, Html, e, how, num, table
from ._numbers import margins
from ._schema import AuditSummary

DRILL_PARTS = 5
"""Parts a pair's drill-down lists: its largest |total effect| (`Faithfulness.top` over that pair)."""
DRILL_TOKENS = 5
"""Tokens per side a pair's drill-down lists: its largest |value| (`TokenAttribution.top`)."""


def _parts(a: Audit, i: int) -> Html:
    """Pair `i`'s top parts: attribution, direct, indirect and total effect on its margin (reward units)."""
    f = a.faithfulness
    one = np.zeros(len(f.total), dtype=bool)
    one[i] = True
    rows = [(f.names[j], num(abs(f.total[i, j])), num(f.total[i, j]), num(f.attribution[i, j]), num(f.direct[i, j]),
             num(f.indirect[i, j])) for j in f.top(DRILL_PARTS, rows=one)]
    return Html(f"<h4>Top parts of this pair by |total effect| ({e(f.mode)}, reward units)</h4>"
                + table(["part", "|total| (ranked by)", "total", "attribution", "direct", "indirect"], rows))


def _tokens(a: Audit, i: int) -> Html:
    """Pair `i`'s tokens with the largest |value| on each side, when the audit attributed its tokens."""
    t = a.tokens
    if t is None or i not in a.token_pairs:
        return Html('<p class="note">The audit did not attribute this pair\'s tokens (it attributes the pairs with '
                    "the largest |margin|); <code>rewardlens tokens</code> attributes any pair.</p>")
    j = a.token_pairs.index(i)  # the token rows hold the attributed pairs in `token_pairs` order
    row = {pair_of(r): r for r in range(len(t.rows))}
    if t.roles is None:  # stored before token roles: every token, template included
        rows = [(s, pos, text, num(v)) for s in SIDES for pos, text, v in t.top(row[j, s], DRILL_TOKENS)]
        return Html("<h4>Tokens adding most to each side's reward (reward units; all of them in the Tokens "
                    "section)</h4>" + table(["side", "position", "token", "value"], rows))
    cells: list[tuple[object, ...]] = []
    for s in SIDES:  # the content view: the response's and prompt's own tokens, the template's as one row
        r = row[j, s]
        cells += [(s, role, pos, text, num(v)) for role in ("response", "prompt")
                  for pos, text, v in t.top(r, DRILL_TOKENS, role)]
        cells.append((s, "template", "—", f"{t.role_names(r).count('template')} tokens, summed",
                      num(t.groups(r)["template"])))
    return Html("<h4>Response and prompt tokens adding most to each side's reward, the template's summed (exact "
                "direct split, reward units; all of them in the Tokens section)</h4>"
                + table(["side", "role", "position", "token", "value"], cells))


def drill(a: Audit, i: int) -> Html:
    """What pair `i`'s row expands to: its parts and patching effects, then its tokens."""
    return Html(f'<div class="pairdrill" data-pair="{e(a.pair_ids[i])}">' + _parts(a, i) + _tokens(a, i) + "</div>")


def scores(a: Audit, _s: AuditSummary) -> Html:  # RENDER's signature (called positionally)
    chosen, rejected, margin = margins(a)
    cl, cn = depths(a).values()  # linear, normed
    names = labels(a)
    rows: list[tuple[object, ...]] = [
        (i, pid, *([names[i]] if names is not None else []), num(c), num(r), num(m),
         "chosen" if m > 0 else "rejected" if m < 0 else "tie", num(x), num(y))
        for i, (pid, c, r, m, x, y) in enumerate(zip(a.pair_ids, chosen, rejected, margin, cl, cn))]
    headers = ["#", "pair", *(["subset"] if names is not None else []), "chosen", "rejected", "margin", "prefers",
               "crystallization linear", "crystallization normed"]
    collapse = (f"; the {TOP_ROWS} pairs with the largest |margin| are shown, the others a click away"
                if len(rows) > TOP_ROWS else "")
    intro = how("Each pair's rewards from the model's fp32 head, in reward units. A row is marked when the model "
                "prefers the rejected response. Crystallization depth is l/L (— where the final margin is too small "
                f"to have a side). ▸ opens a pair: its top parts, their patching effects and its tokens{collapse}.")
    return Html(intro + table(headers, rows, ["bad" if m <= 0 else "" for m in margin], subsets=names,
                              top=shown_pairs(np.asarray(margin, dtype=np.float64), TOP_ROWS),
                              drill=[drill(a, i) for i in range(len(rows))]))
