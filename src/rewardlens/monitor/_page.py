"""`monitor_report`: a policy run's log as one self-contained HTML page (inline SVG, no scripts, no
external files): reward over steps with the alarms marked, each bias direction's share of the
reward gain, and the alarms in plain words with their step. A view over the log, never a computation."""

from __future__ import annotations

import html
import os
from pathlib import Path

import numpy as np

from ._policy_log import PolicyRun

SECTIONS = ("reward", "shares", "alarms")
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")
W, H, PAD = 640, 260, 44
STYLE = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:760px;
color:#222;line-height:1.45}h1{font-size:1.5rem}h2{font-size:1.15rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
svg{background:#fafafa;border:1px solid #e4e4e4}table{border-collapse:collapse}td,th{padding:.2rem .6rem;
border-bottom:1px solid #eee;text-align:left}.muted{color:#777}"""


def _scale(values: np.ndarray, lo: float, hi: float, out_lo: float, out_hi: float) -> np.ndarray:
    span = hi - lo if hi > lo else 1.0
    return out_lo + (values - lo) / span * (out_hi - out_lo)


def _chart(label: str, steps: np.ndarray, series: dict[str, np.ndarray], marks: list[int], ylabel: str) -> str:
    """An SVG line chart of `series` over `steps`, with vertical red lines at `marks`."""
    finite = np.concatenate([v[np.isfinite(v)] for v in series.values()] + [np.zeros(0)])
    lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    s0, s1 = float(steps.min()), float(steps.max())
    x = _scale(steps.astype(float), s0, s1, PAD, W - 10)
    parts = [f'<svg id="fig-{label}" role="img" aria-label="{html.escape(ylabel)}" width="{W}" height="{H}" '
             f'viewBox="0 0 {W} {H}" xmlns="http://www.w3.org/2000/svg">']
    parts.append(f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#999"/>')
    parts.append(f'<text x="{PAD}" y="{H - 12}" font-size="11">step {s0:g}</text>'
                 f'<text x="{W - 70}" y="{H - 12}" font-size="11">step {s1:g}</text>'
                 f'<text x="4" y="14" font-size="11">{html.escape(ylabel)}: {lo:.3g} to {hi:.3g}</text>')
    for step in marks:
        xm = float(_scale(np.array([float(step)]), s0, s1, PAD, W - 10)[0])
        parts.append(f'<line class="alarm" x1="{xm:.1f}" y1="20" x2="{xm:.1f}" y2="{H - PAD}" stroke="#d62728" '
                     'stroke-dasharray="4 3"/>')
    for i, (name, values) in enumerate(series.items()):
        keep = np.isfinite(values)
        y = _scale(values, lo, hi, H - PAD, 24)
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x[keep], y[keep]))
        color = COLORS[i % len(COLORS)]
        parts.append(f'<polyline class="series" data-name="{html.escape(name)}" fill="none" stroke="{color}" '
                     f'stroke-width="2" points="{pts}"/>')
        parts.append(f'<text x="{W - 150}" y="{30 + 13 * i}" font-size="11" fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render(run: PolicyRun, title: str = "Policy monitor") -> str:
    """The page for `run` (a string of HTML)."""
    frame = run.to_frame()
    steps = frame.index.to_numpy()
    alarms = run.alarms
    shares = {t: frame[f"share/{t}"].to_numpy() for t in run.terms if f"share/{t}" in frame}
    rows = "".join(f"<tr><td>{a.step}</td><td>{html.escape(a.kind)}</td><td>{html.escape(a.message)}</td></tr>"
                   for a in alarms)
    table = (f"<table><tr><th>step</th><th>kind</th><th>alarm</th></tr>{rows}</table>" if alarms
             else '<p class="muted">No alarm: no bias direction explains most of the reward gain, and no surface '
                  "statistic tracks the reward, with its whole 95% interval above the threshold.</p>")
    last = run.records[-1]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
        f'<p>{len(run)} batches, steps {steps.min()}–{steps.max()}; bias directions: '
        f'{html.escape(", ".join(last.directions))}; last gain {last.gain:+.3f} reward units.</p>',
        '<section id="reward"><h2>Reward over steps</h2>',
        _chart("reward", steps, {"mean reward": frame["reward"].to_numpy()}, [a.step for a in alarms], "mean reward"),
        '</section><section id="shares"><h2>Share of the reward gain since the baseline</h2>',
        _chart("shares", steps, shares, [a.step for a in alarms if a.kind == "direction"], "share of gain"),
        '<p class="muted">Each term is the exact part of the reward along one bias direction (orthonormalised '
        "symmetrically), the rest of the head's input (rest) and the constant; the shares add up to 1.</p>",
        f'</section><section id="alarms"><h2>Alarms</h2>{table}</section>', "</body></html>",
    ])


def monitor_report(log: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Write the page for the policy monitor log `log` to `out` (default: next to it, `.html`)."""
    path = Path(log)
    target = path.with_suffix(".html") if out is None else Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(PolicyRun.from_jsonl(path), title=f"Policy monitor: {path.name}"))
    return target
