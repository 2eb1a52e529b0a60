"""Numbers of the instruments the audit added beside its per-pair core: the direct / indirect split of
the top parts, divergence flags on the patching effects, distortion, cascades, conflicts, tokens.

Each function returns plain Python values (NaN where undefined) for `summary`, or None when the
audit lacks the instrument. Nothing here runs a model: every number is read off a stored result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stats import mean_abs
from .._runner import Audit
from .._whole import TOKEN_PAIRS, shown_pairs
from ._groups import TOP_PARTS, counted, counted_mean, top_parts
from ._schema import TopPart

"""The token section shows at most this many pairs: those with the largest |margin|."""


def estimands(audit: Audit) -> list[dict[str, Any]]:
    """Per top part (largest mean |total effect| over the counted pairs, `Faithfulness.top`, shown as
    `mean_abs_total`): mean attribution, direct, indirect and total effect, and the indirect share
    mean|indirect| / (mean|direct| + mean|indirect|) (NaN when both are zero). Every mean is over the
    counted pairs (`counted_mean`), as in the table of top parts."""
    f = audit.faithfulness
    ranking = mean_abs(f.total[counted(audit).finite])
    att, direct, indirect, total = (counted_mean(audit, v) for v in (f.attribution, f.direct, f.indirect, f.total))
    size_direct, size_indirect = counted_mean(audit, np.abs(f.direct)), counted_mean(audit, np.abs(f.indirect))
    out = []
    for i in top_parts(audit):
        size = float(size_direct[i] + size_indirect[i])
        out.append({"part": f.names[i], "mean_abs_total": float(ranking[i]), "attribution": float(att[i]),
                    "direct": float(direct[i]), "indirect": float(indirect[i]), "total": float(total[i]),
                    "indirect_share": float(size_indirect[i]) / size if size > 0 else float("nan")})
    return out


def top_parts_table(audit: Audit, k: int = TOP_PARTS) -> list[TopPart]:
    """The `k` top parts (`top_parts`: mean |total effect| over the counted pairs, noising at the read positions), each
    with its mean exact attribution, total, direct and indirect effect, and its patched runs out of the
    natural distribution (None when divergence was not run). Means are over the counted pairs (`counted`)."""
    f, d, ok = audit.faithfulness, audit.divergence, counted(audit).finite
    flagged = {} if d is None else dict(zip(d.names, d.flagged.sum(0).tolist()))
    att, total, direct = (counted_mean(audit, v) for v in (f.attribution, f.total, f.direct))
    ranking = mean_abs(f.total[ok])  # what `top_parts` ranks by, shown beside the signed means
    return [{"part": f.names[i], "mean_abs_total_effect": float(ranking[i]), "attribution": float(att[i]),
             "total_effect": float(total[i]),
             "direct_effect": float(direct[i]), "indirect_effect": float(total[i] - direct[i]),
             "out_of_distribution_runs": flagged.get(f.names[i])} for i in top_parts(audit, k)]


def divergence(audit: Audit) -> dict[str, Any] | None:
    """Divergence flags for the patching effects the report shows (the top parts), and their reliability.

    The effects are the audit's own (`Faithfulness.total` over the counted pairs, as every table of parts);
    the divergence scores, of the same patched runs (the audit scores faithfulness's sweep), say which it flags."""
    d = audit.divergence
    if d is None or d.divergence is None:
        return None
    f, ok = audit.faithfulness, counted(audit).finite
    ranking = mean_abs(f.total[ok])  # the rows' order (`top_parts`), shown as a column
    mean = counted_mean(audit, f.total)
    parts = []
    for i in top_parts(audit):
        j = d.names.index(f.names[i])
        flagged, effect = d.flagged[:, j], f.total[:, i]
        inside = ok & ~flagged
        parts.append({"part": f.names[i], "mean_abs_total": float(ranking[i]), "runs": int(len(effect)),
                      "flagged_runs": int(flagged.sum()),
                      "max_score": float(np.max(d.divergence[:, j])), "mean_effect": float(mean[i]),
                      "mean_effect_in_distribution": float(effect[inside].mean()) if inside.any()
                      else float("nan")})
    return {"mode": d.mode, "positions": d.positions, "level": d.level, **d.reliability(),
            "parts": parts}


def distortion(audit: Audit) -> dict[str, Any] | None:
    """Distortion index of every probe axis against every quality dimension, with CIs and notes."""
    d = audit.distortion
    if d is None:
        return None
    quality = {q: {"effect": float(d.quality_effect[k]), "lo": float(d.quality_ci[k, 0]),
                   "hi": float(d.quality_ci[k, 1]), "note": d.note[k]} for k, q in enumerate(d.quality)}
    axes = {a: {q: {"index": float(d.index[i, k]), "lo": float(d.ci[i, k, 0]), "hi": float(d.ci[i, k, 1]),
                    "flagged": bool(d.flagged[i, k])} for k, q in enumerate(d.quality)}
            for i, a in enumerate(d.axes)}
    flagged = [f"{a} vs {q}" for i, a in enumerate(d.axes) for k, q in enumerate(d.quality) if d.flagged[i, k]]
    return {"threshold": d.threshold, "quality": quality, "axes": axes, "flagged": flagged}


def cascades(audit: Audit, n_links: int = 10) -> dict[str, Any] | None:
    """Clusters of probe axes that fail together, and the strongest defined links between axes."""
    c = audit.cascades
    if c is None:
        return None
    m = len(c.axes)
    links: list[dict[str, Any]] = [
        {"axis_a": c.axes[i], "axis_b": c.axes[j], "rho": float(c.rho[i, j]), "lo": float(c.ci[i, j, 0]),
         "hi": float(c.ci[i, j, 1]), "n_shared": int(c.n_shared[i, j])}
        for i in range(m) for j in range(i + 1, m) if np.isfinite(c.rho[i, j])]
    links.sort(key=lambda r: -r["rho"])
    off = ~np.eye(m, dtype=bool)
    return {"min_items": c.min_items, "threshold": c.threshold, "clusters": [list(g) for g in c.clusters],
            "defined_links": len(links), "max_shared_items": int(c.n_shared[off].max()) if m > 1 else 0,
            "links": links[:n_links]}


def conflicts(audit: Audit) -> dict[str, Any] | None:
    """A multi-objective head's terms: every pair of terms' cosine, margin correlation, decisive
    disagreement share and relation."""
    c = audit.conflicts
    if c is None:
        return None
    return {"names": list(c.names), "source": c.source, "direction_note": c.direction_note,
            "margin_units": c.margin_units, "n_pairs": c.n_pairs, "pairs": c.pairs_table()}


def tokens(audit: Audit, margins: np.ndarray) -> dict[str, Any] | None:
    """Which pairs the token section shows, and the split's closure error (reward units)."""
    t = audit.tokens
    if t is None:
        return None
    shown = [audit.token_pairs[i] for i in shown_pairs(margins[audit.token_pairs])]
    return {"rows": len(t.rows), "cap": TOKEN_PAIRS, "shown": [audit.pair_ids[i] for i in shown],
            "closure_error": float(np.max(np.abs(t.residual_error))) if len(t.rows) else float("nan")}
