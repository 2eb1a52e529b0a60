"""The report's section for a reward read at a set of positions: where each pair's preference forms.

A process reward model scores every step; the step whose score differs most between the chosen and
the rejected side is where the pair's preference forms (steps are paired k to k, over the steps
both sides have). A DPO reward reads every response token; its sides have different tokens, so each
side's read with the largest weighted score is shown instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...data.internal import rows_of
from ...exact import Steps
from .._runner import Audit
from ._html import Html, e, how, num, table
from ._schema import AuditSummary

SHOWN = 20
"""Pairs listed one by one in the section (numbers.json holds every pair)."""


def _side(steps: Steps, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores, weights, token positions) of one input row's reads, in step order."""
    mine = steps.sequence == row
    order = np.argsort(steps.step[mine], kind="stable")
    return steps.reward[mine][order], steps.weight[mine][order], steps.position[mine][order]


def forms_at(steps: Steps, pair: int) -> int | None:
    """The step (0-based) whose score differs most between the two sides of `pair`, over the steps both
    sides have; None when a side has no read or no such step has a finite score on both sides."""
    chosen, rejected = (_side(steps, row)[0] for row in rows_of(pair))
    shared = min(len(chosen), len(rejected))
    return _largest(np.abs(chosen[:shared] - rejected[:shared]))


def _largest(x: np.ndarray) -> int | None:
    """Where `x` [m] is largest among its finite entries; None when it has none (no read, or only NaN:
    a NaN read must not pass for the step where a preference forms)."""
    finite = np.isfinite(x)
    return None if not finite.any() else int(np.argmax(np.where(finite, x, -np.inf)))


def steps_summary(audit: Audit) -> dict[str, Any] | None:
    """Per pair: both sides' read counts and scores, the step where the preference forms, and each
    side's read with the largest |weight × score| (its token position); None for one read per sequence."""
    s = audit.steps
    if s is None:
        return None
    pairs = []
    for p, pid in enumerate(audit.pair_ids):
        sides = [_side(s, 2 * p + side) for side in (0, 1)]
        top = [None if (k := _largest(np.abs(w * r))) is None else int(pos[k]) for r, w, pos in sides]
        pairs.append({"pair_id": pid, "reads": [len(r) for r, _, _ in sides],
                      "chosen": sides[0][0].tolist(), "rejected": sides[1][0].tolist(),
                      "forms_at_step": forms_at(s, p), "top_read_position": top})
    counts: dict[int, int] = {}
    for row in pairs:
        if row["forms_at_step"] is not None:
            counts[row["forms_at_step"]] = counts.get(row["forms_at_step"], 0) + 1
    return {"pairs": pairs, "forms_at_step_counts": {str(k): v for k, v in sorted(counts.items())}}


def _scores(values: list[float]) -> str:
    shown = ", ".join(num(v, 2) for v in values[:8])
    return shown + (f", … ({len(values)} in all)" if len(values) > 8 else "")


def steps_section(_a: Audit, s: AuditSummary) -> Html:  # RENDER's signature (called positionally)
    got = s["steps"]
    assert got is not None  # render() shows the not-run note instead
    text = how("This model reads its reward at a set of positions (a process reward model's steps, or a DPO "
               "reward's response tokens) and combines them. Each read's own score is exact, like the "
               "sequence's. 'Forms at step' is the step whose score differs most between the chosen and the "
               "rejected side, over the steps both have: where the pair's preference forms. For DPO rewards, whose "
               "two sides have different tokens, compare each side's read with the largest weighted score.")
    counts = ", ".join(f"step {k}: {v}" for k, v in got["forms_at_step_counts"].items()) or "—"
    rows = [(e(r["pair_id"]), f"{r['reads'][0]} / {r['reads'][1]}", num(r["forms_at_step"]),
             _scores(r["chosen"]), _scores(r["rejected"]),
             " / ".join(num(t) for t in r["top_read_position"])) for r in got["pairs"][:SHOWN]]
    more = f" (the first {SHOWN} of {len(got['pairs'])}; numbers.json has all)" if len(got["pairs"]) > SHOWN else ""
    return Html(text + Html(f"<p>Pairs per step where the preference forms: {e(counts)}.</p>")
                + Html(f"<h3>Pairs{e(more)}</h3>")
                + table(["pair", "reads (chosen / rejected)", "forms at step", "chosen step scores",
                         "rejected step scores", "largest weighted read: token (chosen / rejected)"], rows))
