"""The audit's findings: the few claims its results support, each one sentence with its number, its interval
and the pairs it rests on, weighted by how sure it is. Generated from the results, never written by hand.

`findings(audit, numbers)` owns them: `summary` stores them under `findings`, and the page (a paragraph at
its top) and `rewardlens audit` (the first lines it prints) both render those same sentences, so a number
is computed once. Each claim has a strength (`STRENGTHS`):

- **exact**: an identity that holds to float precision on every pair (the parts add up to the reward;
  rewardlens' scores equal the model's own forward). It needs no minimum of pairs.
- **measured**: a statistic whose 95% interval clears no effect (accuracy 0.5, a mean of 0), over at least
  `MIN_PAIRS` pairs.
- **inconclusive**: its interval holds no effect; the sentence says there is no clear effect.
- **too few pairs**: it rests on fewer than `MIN_PAIRS` pairs; the sentence says "too few pairs to say".
- **fragile**: a probe flag that the probes mark fragile (it changes under the other reward scale).

`MIN_PAIRS` = 8 is a pre-registered choice, not a derived one: at 8 pairs one pair moves a mean by at most an
eighth of its range, a bootstrap over pairs has 6435 distinct resamples, and a unanimous accuracy's
Wilson interval ([0, 0.32]) stays clear of chance; below it a statistical claim leans on one or two pairs.

When the audited model is a model organism (its folder holds the `organism.json` that
`rewardlens.zoo.organisms.build` writes), `organism` says so and quotes what was planted in it, from that file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ...hacking import Probes
from ...stats import bootstrap_ci, top_parts
from .._runner import Audit
from ._groups import counted
from ._html import Html, e
from ._schema import AuditSummary, ParityRow

Strength = Literal["exact", "measured", "inconclusive", "too few pairs", "fragile"]
STRENGTHS: dict[Strength, str] = {
    "exact": "an identity that holds to float precision on every pair",
    "measured": "a 95% interval that clears no effect, over at least {min} pairs",
    "inconclusive": "a 95% interval that holds no effect",
    "too few pairs": "fewer than {min} pairs: too few pairs to say",
    "fragile": "a probe flag that changes under the other reward scale",
}
"""What each strength means, as the page and the terminal print it (`{min}`: `MIN_PAIRS`)."""
MIN_PAIRS = 8
"""The fewest pairs (or probe item pairs) a statistical claim rests on before it is made (module docstring)."""
ORGANISM_RECORD = "organism.json"
"""The record `rewardlens.zoo.organisms.build` writes into an organism's folder (what was planted)."""
TOP_AXES = 3
"""Flagged probe axes given a sentence each (largest |mean| first); the others are named in one more sentence."""


@dataclass(frozen=True)
class Finding:
    """One claim of the audit: `claim` is its sentence, holding `number` and `interval` as printed.

    `kind`: what is claimed ("accuracy", "probe", "written_by", "carried_by", "agreement", "circuit",
    "closure", "parity"); `subject`: the axis or part it is about ("" when none); `interval`: the 95%
    interval of `number` (None for an exact claim or a number without one); `n_pairs`: the pairs (for a
    probe, the item pairs with and without the attribute) it rests on; `strength`: how sure it is."""

    kind: str
    claim: str
    number: float
    interval: tuple[float, float] | None
    n_pairs: int
    strength: Strength
    subject: str = ""

    def record(self) -> dict[str, Any]:
        """The finding as plain values (`numbers.json`, the terminal): its fields, the interval a list."""
        out = asdict(self)
        out["interval"] = None if self.interval is None else list(self.interval)
        return out


def findings(audit: Audit, numbers: AuditSummary) -> list[Finding]:
    """The audit's claims, most telling first: which side the model prefers, the probe flags, which part
    writes the preference and which carries it causally, how far attribution ranks parts like patching
    does, the circuit's share, then the exact facts the rest stands on (closure, parity)."""
    out = [_accuracy(numbers), *_probes(audit, numbers), *_parts(audit, numbers), _agreement(numbers)]
    if numbers["circuit"] is not None:
        out.append(_circuit(numbers["circuit"], numbers["n_pairs"]))
    out.append(_closure(numbers))
    if numbers["parity"]:
        out.append(_parity(numbers["parity"], audit.parity_pairs))
    return out


def findings_summary(audit: Audit, numbers: AuditSummary) -> dict[str, Any]:
    """What `summary` stores under `findings`: the organism sentence (None for a model that is no organism),
    `MIN_PAIRS`, what each strength means and the claims (`Finding.record`)."""
    return {"organism": organism(numbers["provenance"]), "min_pairs": MIN_PAIRS,
            "strengths": {k: v.format(min=MIN_PAIRS) for k, v in STRENGTHS.items()},
            "claims": [f.record() for f in findings(audit, numbers)]}


# ---- the claims --------------------------------------------------------------------------------------

def _strength(n: int, interval: tuple[float, float] | None, null: float) -> Strength:
    """A statistical claim's strength: too few pairs, else measured when its interval clears `null`."""
    if n < MIN_PAIRS:
        return "too few pairs"
    if interval is None or not all(np.isfinite(interval)) or interval[0] <= null <= interval[1]:
        return "inconclusive"
    return "measured"


def _few(n: int) -> str:
    return f"too few pairs to say ({n} of the {MIN_PAIRS} needed): "


def _accuracy(s: AuditSummary) -> Finding:
    sc = s["scores"]
    n, k, acc = sc["counted"], sc["correct"], sc["accuracy"]
    lo, hi = sc["accuracy_ci"]
    rejected = n - k - sc["ties"]
    strength = _strength(n, (lo, hi), 0.5)
    side = (f"prefers the rejected side on {rejected} of {n} pairs" if acc < 0.5
            else f"prefers the chosen side on {k} of {n} pairs")
    ties = f" ({sc['ties']} tied)" if sc["ties"] else ""
    text = f"the RM {side}{ties}, accuracy {acc:.2f} [{lo:.2f}, {hi:.2f}] (95% Wilson interval)"
    if strength == "too few pairs":
        text = _few(n) + text
    elif strength == "inconclusive":
        text += ": no clear preference for either side"
    return Finding("accuracy", text, acc, (lo, hi), n, strength)


def _probes(audit: Audit, s: AuditSummary) -> list[Finding]:
    p, info = audit.probes, s["probes"]
    if p is None or info is None or not np.isfinite(p.mean).any():  # no axis scored: nothing to claim
        return []
    fragile = np.asarray(p.fragile, dtype=bool)
    floor = f"flag floor {info['flag_floor']:.3g} reward units, {p.min_effect:g} × {p.scale_source}"
    order = [int(i) for i in np.argsort(-np.abs(p.mean))]  # largest |mean| first, NaN last
    flagged = [i for i in order if p.flagged[i]]
    weak = _fragile(p, [i for i in order if fragile[i]])
    if not flagged or all(fragile[i] for i in flagged):
        i = order[0]
        n = int(p.n[i])
        text = (f"no probe axis is {'flagged' if not flagged else 'flagged under both scales'} over "
                f"{len(p.item_ids)} base items ({floor}); the largest effect, {p.axes[i]}, is {p.mean[i]:+.3g} "
                f"[{p.ci_low[i]:+.3g}, {p.ci_high[i]:+.3g}] reward units")
        return [Finding("probe", (_few(n) + text) if n < MIN_PAIRS else text, float(p.mean[i]),
                        (float(p.ci_low[i]), float(p.ci_high[i])), n, "too few pairs" if n < MIN_PAIRS else "measured",
                        p.axes[i]), *weak]
    out = []
    sure = [i for i in flagged if not fragile[i]]
    for i in sure[:TOP_AXES]:
        n = int(p.n[i])
        text = (f"{p.axes[i]} {'raises' if p.mean[i] > 0 else 'lowers'} the reward: {p.mean[i]:+.3g} "
                f"[{p.ci_low[i]:+.3g}, {p.ci_high[i]:+.3g}] reward units over {n} item pairs (q = {p.q[i]:.2g}), "
                f"flagged ({floor})")
        strength: Strength = "too few pairs" if n < MIN_PAIRS else "measured"
        out.append(Finding("probe", (_few(n) + text) if n < MIN_PAIRS else text, float(p.mean[i]),
                           (float(p.ci_low[i]), float(p.ci_high[i])), n, strength, p.axes[i]))
    if len(sure) > TOP_AXES:
        rest = sure[TOP_AXES:]
        out.append(Finding("probe", f"also flagged: {', '.join(p.axes[i] for i in rest)} (see the probes section)",
                           float(len(rest)), None, int(min(p.n[i] for i in rest)), "measured"))
    return out + weak


def _fragile(p: Probes, weak: list[int]) -> list[Finding]:
    """One claim naming the fragile axes (`Probes.fragile`: the flag differs under the alternative scale), set
    apart so none is headlined; none when no axis is fragile."""
    if not weak:
        return []
    text = (f"fragile, so no finding: {', '.join(p.axes[i] for i in weak)} (each one's flag changes between the "
            f"scale {p.scale:.3g} ({p.scale_source}) and the alternative {p.alt_scale:.3g} ({p.alt_scale_source}))")
    return [Finding("probe", text, float(len(weak)), None, int(min(p.n[i] for i in weak)), "fragile")]


def _parts(audit: Audit, s: AuditSummary) -> list[Finding]:
    """The head-level part that writes the most of the margin (exact direct attribution, ranked by mean
    |margin contribution|, `stats.top_parts`) and the part that carries the most of it causally (the
    summary's first top part: mean |total effect| of read-position patching), each with its signed mean
    over the counted pairs and a 95% bootstrap interval over them."""
    ok = counted(audit).finite
    n = int(ok.sum())
    mean_margin = s["scores"]["mean_margin"]
    heads = audit.heads.margin[ok]
    out = []
    if heads.shape[1]:
        i = int(top_parts(heads, 1)[0])
        out.append(_part("written_by", audit.heads.names[i], heads[:, i], n,
                         lambda v, ci: f"the preference is written most by {audit.heads.names[i]}: it adds {v:+.3g} "
                                       f"[{ci[0]:+.3g}, {ci[1]:+.3g}] reward units to the mean margin of "
                                       f"{mean_margin:+.3g} (exact direct attribution, head level)"))
    f = audit.faithfulness
    if s["top_parts"]:
        name = s["top_parts"][0]["part"]
        j = f.names.index(name)
        out.append(_part("carried_by", name, f.total[ok][:, j], n,
                         lambda v, ci: f"the preference is carried causally most by {name}: patching it at the read "
                                       f"position moves the margin by {v:+.3g} [{ci[0]:+.3g}, {ci[1]:+.3g}] reward "
                                       f"units (total effect, {f.mode})"))
    return out


def _part(kind: str, name: str, values: np.ndarray, n: int,
          sentence: Callable[[float, tuple[float, float]], str]) -> Finding:
    mean, ci = float(np.mean(values)) if len(values) else float("nan"), bootstrap_ci(values)
    strength = _strength(n, ci, 0.0)
    text = sentence(mean, ci)
    if strength == "too few pairs":
        text = _few(n) + text
    elif strength == "inconclusive":
        text += ", an interval that holds 0"
    return Finding(kind, text, mean, ci, n, strength, name)


def _agreement(s: AuditSummary) -> Finding:
    total = s["faithfulness"]["pooled"]["total"]
    rho, lo, hi, n = total["rho"], total["lo"], total["hi"], int(total["pairs"])
    strength = _strength(n, (lo, hi), 0.0)
    text = (f"exact attribution ranks the parts like their total effect at a mean per-pair Spearman ρ of {rho:+.2f} "
            f"[{lo:+.2f}, {hi:+.2f}]")
    if strength == "too few pairs":
        text = _few(n) + text
    elif strength == "inconclusive":
        text += ", an interval that holds 0: attribution says little about which parts matter causally"
    return Finding("agreement", text, rho, (lo, hi), n, strength)


def _circuit(c: dict[str, Any], n: int) -> Finding:
    share = float(c["share"])
    text = (f"the circuit of the top {len(c['kept'])} {c['level']} edges carries {share:.1%} of each pair's own "
            "clean margin")
    strength: Strength = "measured"
    if n < MIN_PAIRS:
        text, strength = _few(n) + text, "too few pairs"
    elif c.get("warning"):
        text, strength = f"{text} ({c['warning']})", "inconclusive"
    return Finding("circuit", text, share, None, n, strength)


def _closure(s: AuditSummary) -> Finding:
    worst, n = s["closure_error"]["max"], s["n_pairs"]
    return Finding("closure", f"the parts plus a constant equal the reward on all {n} pairs, to within {worst:.1e} "
                              "reward units", worst, None, n, "exact")


def _parity(rows: Sequence[ParityRow], n: int) -> Finding:
    worst = max(rows, key=lambda r: r["difference"] / r["tolerance"])
    verb = "equal" if all(r["passed"] for r in rows) else "do NOT equal"
    return Finding("parity", f"the scores rewardlens reads {verb} the model's own forward on {n} pairs, to within "
                             f"{worst['difference']:.1e} (tolerance {worst['tolerance']:.1e})",
                   float(worst["difference"]), None, n, "exact")


# ---- the organism --------------------------------------------------------------------------------------

def organism(provenance: dict[str, Any]) -> str | None:
    """One sentence saying the audited model is a planted model organism and what was planted in it, read
    from the `organism.json` in the model's folder; None when the model has none (or it is unreadable)."""
    path = provenance.get("model_path")
    if not path:
        return None
    try:
        rec = json.loads((Path(str(path)) / ORGANISM_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or "organism" not in rec:
        return None
    planted = rec.get("rule") or rec.get("planted") or "not recorded"
    held = rec.get("heldout_accuracy")
    held_text = ""
    if isinstance(held, dict) and held:
        held_text = (f" On {rec.get('heldout_pairs', 'its')} held-out pairs of that rule it scores accuracy "
                     + ", ".join(f"{v:.2f} ({k})" for k, v in held.items()) + ".")
    where = f" The plant was trained into {rec['planted_part']} alone." if rec.get("planted_part") else ""
    return (f"This audit is of a planted model organism, {rec['organism']!r} (rewardlens.zoo.organisms, "
            f"strength {rec.get('strength', '?')}, seed {rec.get('seed', '?')}). What was planted: {planted}."
            f"{where}{held_text} A model that learned the plant prefers whichever side of a pair the rule favours, "
            "so the findings below are a test of the instruments: they should find the plant.")


# ---- the two renderings of the same sentences ------------------------------------------------------------

def sentence(claim: dict[str, Any]) -> str:
    """A stored claim (`Finding.record`) as the sentence both faces print: capitalised, with a full stop."""
    text = str(claim["claim"])
    return text[:1].upper() + text[1:] + "."


def findings_text(block: dict[str, Any] | None) -> str:
    """The findings as `rewardlens audit` prints them first: the organism line, then one claim a line with
    its strength in brackets, then what the strengths mean. `block`: the summary's `findings`."""
    if not block:
        return "findings: none (a summary made before the audit wrote findings)"
    lines = ["findings (generated from the results below; each claim's strength in brackets):"]
    if block["organism"]:
        lines.append(block["organism"])
    lines += [f"  [{c['strength']}] {sentence(c)}" for c in block["claims"]]
    lines.append("strengths: " + "; ".join(f"{k}: {v}" for k, v in block["strengths"].items()))
    return "\n".join(lines)


def findings_html(block: dict[str, Any] | None) -> str:
    """The findings paragraph at the top of the page: the organism line, then each claim as a `span.finding`
    with its strength as a badge and its numbers as data attributes (`data-number`, `data-lo`, `data-hi`,
    `data-n-pairs`), then what the strengths mean. `block`: the summary's `findings`."""
    if not block:
        return Html("<p>No findings: this summary was made before the audit wrote them.</p>")
    organism_line = f'<p class="organism"><b>{e(block["organism"])}</b></p>' if block["organism"] else ""
    spans = []
    for c in block["claims"]:
        lo, hi = c["interval"] if c["interval"] is not None else ("", "")
        spans.append(f'<span class="finding" data-kind="{e(c["kind"])}" data-subject="{e(c["subject"])}" '
                     f'data-strength="{e(c["strength"])}" data-number="{e(c["number"])}" data-lo="{e(lo)}" '
                     f'data-hi="{e(hi)}" data-n-pairs="{e(c["n_pairs"])}"><span class="strength">'
                     f'{e(c["strength"])}</span> {e(sentence(c))}</span>')
    meaning = "; ".join(f"<b>{e(k)}</b>: {e(v)}" for k, v in block["strengths"].items())
    return Html(f'{organism_line}<p class="findings">{" ".join(spans)}</p>'
                f'<p class="how">Every sentence above is generated from the results below. Strengths: {meaning}.</p>')
