"""`loop_report`: the closed loop's result as one self-contained HTML page (inline SVG, no script).

Per organism two charts, the behaviour rate and the mean reward over GRPO steps (seed means), the
original reward model's runs solid and the edited one's dashed, each planted-direction alarm of a
run as a marker at its step; then the summary and the early-warning table.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ._verify import KINDS, ClosedLoop, OrganismLoop

if TYPE_CHECKING:
    import pandas as pd

W, H, PAD = 420, 200, 36
COLOURS = {"original": "#c0392b", "edited": "#2471a3"}


def _e(x: object) -> str:
    """`x` as text inside an element or a quoted attribute: every value that reaches the page passes here."""
    return html.escape(str(x), quote=True)


def _xy(x: np.ndarray, y: np.ndarray, lo: float, hi: float, n: int) -> list[tuple[float, float]]:
    span = hi - lo if hi > lo else 1.0
    return [(PAD + (W - 2 * PAD) * float(a) / max(n - 1, 1), H - PAD - (H - 2 * PAD) * (float(b) - lo) / span)
            for a, b in zip(x, y)]


def _chart(lp: OrganismLoop, what: str, label: str) -> str:
    """One SVG: `what` ('rate' or 'reward') of both reward models' runs over steps."""
    series = {k: np.mean([getattr(t, what) for t in lp.traces[k]], 0) for k in KINDS}
    steps = lp.traces["original"][0].steps
    allv = np.concatenate(list(series.values()))
    lo, hi = (0.0, 1.0) if what == "rate" else (float(allv.min()), float(allv.max()))
    out = [f'<svg class="chart" data-organism="{_e(lp.organism)}" data-what="{_e(what)}" width="{W}" height="{H}" '
           f'xmlns="http://www.w3.org/2000/svg"><rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{PAD}" y="16" font-size="12">{_e(lp.organism)}: {_e(label)}</text>']
    for k, y in series.items():
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in _xy(steps, y, lo, hi, len(steps)))
        dash = ' stroke-dasharray="5,3"' if k == "edited" else ""
        out.append(f'<polyline class="series" data-name="{_e(k)}" fill="none" stroke="{COLOURS[k]}" stroke-width="2"'
                   f'{dash} points="{pts}"/>')
    for k in KINDS:
        for t in lp.traces[k]:
            hit = np.flatnonzero(t.alarms["monitor (planted)"])
            for (a, b), i in zip(_xy(steps[hit], series[k][hit], lo, hi, len(steps)), hit):
                out.append(f'<circle class="alarm" data-rm="{_e(k)}" data-step="{int(t.steps[i])}" cx="{a:.1f}" '
                           f'cy="{b:.1f}" r="3" fill="{COLOURS[k]}"/>')
    out.append(f'<text x="{PAD}" y="{H - 8}" font-size="9">steps 0–{int(steps[-1])}, y {lo:.2f}–{hi:.2f}; solid: '
               "original RM, dashed: edited RM, dots: planted alarms</text></svg>")
    return "".join(out)


def _table(frame: pd.DataFrame, cls: str) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return "—" if not np.isfinite(v) else f"{v:.2f}"
        return _e(v)
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f'<div style="overflow-x:auto"><table class="{_e(cls)}"><tr>{head}</tr>{body}</table></div>'


def page(result: ClosedLoop) -> str:
    """The page's HTML."""
    charts = "".join(f'<section class="organism" id="{_e(lp.organism)}"><h2>{_e(lp.organism)} '
                     f"(planted: {_e(lp.planted)}; edit concept: {_e(lp.concept)})</h2>"
                     f"{_chart(lp, 'rate', 'behaviour rate')}{_chart(lp, 'reward', 'mean reward')}</section>"
                     for lp in result.loops)
    notes: Sequence[str] = result.notes or ("none",)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>rewardlens closed loop</title><style>"
            "body{font-family:sans-serif;max-width:960px;margin:auto}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body><h1>Edit → retrain → verify</h1>"
            f"{charts}<section id='summary'><h2>Behaviour gap</h2>{_table(result._gaps(), 'summary')}</section>"
            f"<section id='warnings'><h2>Early warning</h2>{_table(result.warnings(), 'warnings')}</section>"
            "<section id='notes'><h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes)
            + "</ul></section></body></html>")


def loop_report(result: ClosedLoop, out: str | os.PathLike[str]) -> Path:
    """Write the page to `out` and return its path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(result), encoding="utf-8")
    return path
