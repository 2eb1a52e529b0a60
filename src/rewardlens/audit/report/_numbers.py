"""An audit's numbers: the summary every face shows (one dict, JSON-ready) and its tables (Parquet).

`summary(audit)` is the single source of the headline numbers: the HTML page renders it and
`numbers.json` stores it, so the two can never disagree. `tables(audit)` holds every result's
own `.to_frame()` (unchanged, so a Parquet file round-trips to exactly that frame) plus a few
long frames the results do not have as frames (per-pair scores, concept dose curves, the
faithfulness and concept summaries, probe items).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ...data import chosen, margin, pair_of, rejected
from ...errors import RewardLensError
from ...model.internal import score_pairs
from ...stats import json_ready, to_json
from ...types import SEED_PAPER, SEED_PAPER_RHO
from .._runner import Audit
from . import _instruments as more
from ._findings import findings_summary
from ._groups import TOP_PARTS, counted, depths, labels, parts, spread, subsets, subsets_frame
from ._schema import AuditSummary, FaithfulnessSummary, Interval, PairScore, ParityRow
from ._steps import steps_summary

if TYPE_CHECKING:
    import pandas as pd

    from ...hacking import Probes


def check(audit: Audit) -> None:
    """Raise when the audit's parts do not describe the same pairs (a report would mislabel rows)."""
    n = len(audit.pair_ids)
    shapes = {"lens": audit.lens.reward.shape[0], "sublayers": audit.sublayers.values.shape[0],
              "heads": audit.heads.values.shape[0], "faithfulness": 2 * audit.faithfulness.total.shape[0]}
    wrong = {k: v for k, v in shapes.items() if v != 2 * n}
    if len(audit.subsets) not in (0, n):
        raise RewardLensError(f"the audit names {n} pairs but holds {len(audit.subsets)} subsets; subsets has one "
                              "entry per pair (None where a pair has none), or none at all")
    if wrong or not audit.lens.is_pairs:
        raise RewardLensError(
            f"the audit names {n} pairs, so every per-pair instrument needs {2 * n} inputs (chosen, rejected); "
            f"found {wrong or 'inputs not given as pairs'} — build every instrument from the same list of "
            "rewardlens.Pair and pass their ids as pair_ids"
        )


def _largest(x: np.ndarray) -> float:
    """max |x| over the finite entries (NaN when none is): a pair left out for NaN parts has no closure."""
    finite = np.abs(np.asarray(x, dtype=np.float64))
    finite = finite[np.isfinite(finite)]
    return float(finite.max()) if len(finite) else float("nan")


def margins(audit: Audit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(chosen reward, rejected reward, chosen − rejected margin), each [n_pairs], in reward units."""
    reward = np.asarray(audit.lens.reward, dtype=np.float64)
    return chosen(reward), rejected(reward), margin(reward)


def summary(audit: Audit, top: int = TOP_PARTS) -> AuditSummary:
    """Every headline number of the audit (plain Python values; NaN where undefined): the one dict the
    page, `numbers.json` and `rewardlens audit` show. `top`: how many parts `top_parts` lists.

    Scores count only the pairs whose rewards and parts are finite (`rewardlens.model.internal.score_pairs`):
    the others are named in `scores` (`excluded`, `notes`), never counted as losses; raises
    `NonFiniteError` when no pair is finite, and warns when every counted margin is exactly 0."""
    from ..._version import __version__

    check(audit)
    chosen, rejected, margin = margins(audit)
    kept, acc = score_pairs(audit.lens.reward, [str(i) for i in audit.pair_ids], parts=parts(audit))
    ok = kept.finite
    lens = audit.lens
    crystal = depths(audit)
    closure = {
        "sublayers": _largest(audit.sublayers.residual_error),
        "heads": _largest(audit.heads.residual_error),
        "lens_final": _largest(lens.linear[:, -1] - lens.reward),
    }
    if audit.features is not None:
        closure["features"] = _largest(audit.features.residual_error)
    closure["max"] = max(closure.values())
    out: AuditSummary = {
        "rewardlens_version": __version__, "model": audit.model, "fingerprint": audit.fingerprint,
        "data_checksum": audit.data_checksum, "provenance": provenance(audit),
        "n_pairs": len(audit.pair_ids), "n_layers": lens.n_layers, "skipped": dict(audit.skipped),
        "pairs": [cast(PairScore, {**named, "chosen": float(c), "rejected": float(r), "margin": float(m)})
                  for named, c, r, m in zip(audit.record_rows(_PAIR_KEYS), chosen, rejected, margin)],
        "scores": {
            "accuracy": acc.accuracy, "ties": acc.ties, "correct": acc.correct, "accuracy_ci": list(acc.ci),
            "counted": acc.n, "excluded": list(acc.excluded), "saturated": acc.saturated, "notes": list(acc.notes),
            "line": acc.line(interval=True),
            "mean_margin": float(margin[ok].mean()), "median_margin": float(np.median(margin[ok])),
            "mean_chosen": float(chosen[ok].mean()), "mean_rejected": float(rejected[ok].mean()),
        },
        "lens": {
            "fraction": audit.fraction,
            "crystallization_median": {k: spread(v)["median"] for k, v in crystal.items()},
            "crystallization_iqr": {k: [spread(v)["q25"], spread(v)["q75"]] for k, v in crystal.items()},
            "crystallization_defined": {k: int(np.isfinite(v).sum()) for k, v in crystal.items()},
            "near_zero_margin_pairs": int(lens.near_zero_margin().sum()),
        },
        "closure_error": closure,
        "faithfulness": _faithfulness(audit),
        "probes": None if audit.probes is None else _probes(audit),
        "concepts": None if audit.concepts is None else _concepts(audit),
        "features": None if audit.features is None else _features(audit),
        "subsets": subsets(audit),
        "top_parts": more.top_parts_table(audit, top),
        "estimands": more.estimands(audit),
        "divergence": more.divergence(audit),
        "distortion": more.distortion(audit),
        "cascades": more.cascades(audit),
        "conflicts": more.conflicts(audit),
        "tokens": more.tokens(audit, margin),
        "steps": steps_summary(audit),
        "parity": _parity(audit), "parity_note": audit.parity_note or None,
        "parity_line": None if audit.parity is None else f"on {audit.parity_pairs} pairs: {audit.parity.line()}",
        "circuit": None if audit.circuit is None else audit.circuit.to_dict(),  # the result's own numbers
        "graphs": None if audit.graphs is None else audit.graphs.to_dict(),  # each graph's own numbers
        "findings": None,
    }
    out["findings"] = findings_summary(audit, out)  # the claims quote the numbers above
    return out


def provenance(audit: Audit) -> dict[str, Any]:
    """What the numbers are of: model path or hub id, data file, command line, version, time (UTC).

    Keys the audit does not know (an `Audit` built by hand) are None; version and time are now's."""
    from datetime import datetime, timezone

    from ..._version import __version__

    known = {"model_path": None, "data": None, "command_line": None, "rewardlens_version": __version__,
             "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return {**known, **audit.provenance}


def _faithfulness(audit: Audit) -> FaithfulnessSummary:
    f = audit.faithfulness
    pooled: dict[str, Interval] = {}
    for row in f.rows():  # the estimands' rows; the seed statistics are read below, by name
        if row["comparison"].startswith("attribution vs "):
            name = row["comparison"].removeprefix("attribution vs ")
            pooled[name] = Interval(rho=row["rho"], lo=row["lo"], hi=row["hi"], pairs=row["pairs"])
    (rho, lo, hi), pairs = f.seed_statistic(), int(np.isfinite(f.seed_rho).sum())
    paper = None
    if f.paper_effect is not None:  # the seed paper's own way: prefix noising over attention and MLP sublayers
        (p_rho, p_lo, p_hi), p_pairs = f.paper_statistic(), int(np.isfinite(f.paper_rho).sum())
        paper = {"rho": p_rho, "lo": p_lo, "hi": p_hi, "pairs": p_pairs, "positions": "prefix"}
    return {
        "level": f.level, "mode": f.mode, "n_parts": len(f.names), "pooled": pooled,
        "seed_statistic": {"rho": rho, "lo": lo, "hi": hi, "pairs": pairs, "positions": f.seed_positions,
                           "mode": f.seed_mode, "paper": SEED_PAPER_RHO, "paper_name": SEED_PAPER},
        "paper_statistic": paper,
        "attribution_patching_agreement": f.agreement(),
    }


def _probes(audit: Audit) -> dict[str, Any]:
    p = audit.probes
    assert p is not None
    axes = {a: {"n": int(p.n[i]), "mean": float(p.mean[i]), "ci_low": float(p.ci_low[i]),
                "ci_high": float(p.ci_high[i]), "q": float(p.q[i]), "effect_size": float(p.effect_size[i]),
                "flagged": bool(p.flagged[i]), "fragile": bool(p.fragile[i]), "fragile_reason": p.fragile_reason[i]}
            for i, a in enumerate(p.axes)}
    return {
        "n_items": len(p.item_ids), "budget": p.budget(), "skipped": list(p.skipped), "scale": p.scale,
        "scale_source": p.scale_source, "alt_scale": p.alt_scale, "alt_scale_source": p.alt_scale_source,
        "min_effect": p.min_effect,
        "flag_floor": p.min_effect * p.scale, "level": p.level,
        "flagged": [a for a, f in zip(p.axes, p.flagged) if f], "axes": axes,
        # a fragile flag (it changes under the alternative scale) is shown, never headlined as a finding
        "findings": [a for a, f, w in zip(p.axes, p.flagged, p.fragile) if f and not w],
        "fragile": {a: r for a, r in zip(p.axes, p.fragile_reason) if r}, "headline": _probe_headline(p),
        "per_100_tokens": p.per_100_tokens, "per_100_tokens_ci": list(p.per_100_tokens_ci),
    }


def _probe_headline(p: Probes) -> str:
    """The probes in one line (the page's summary, `rewardlens audit`): the flags that are findings, the fragile
    ones apart, and the scale the floor is stated in, with the alternative each flag was checked under."""
    findings = [a for a, f, w in zip(p.axes, p.flagged, p.fragile) if f and not w]
    fragile = [a for a, w in zip(p.axes, p.fragile) if w]
    alt = "" if np.isnan(p.alt_scale) else f"; checked against {p.alt_scale:.3g} ({p.alt_scale_source})"
    return (", ".join(findings) or "none") + (
        f"; fragile, not findings (the flag changes under the other scale): {', '.join(fragile)}" if fragile else ""
    ) + f" (flag floor {p.min_effect:g} x scale {p.scale:.3g}, {p.scale_source}{alt}) ({p.budget()})"


def _concepts(audit: Audit) -> dict[str, Any]:
    c = audit.concepts
    assert c is not None
    return {"dose_layer": c.dose_layer, "unit": c.unit, "positions": c.positions,
            "alphas": [float(a) for a in c.alphas],
            "concepts": {row.pop("concept"): row for row in c.rows()}}


def _features(audit: Audit) -> dict[str, Any]:
    f = audit.features
    assert f is not None
    totals = f.totals()
    # Where the mean margin sits: the features, the SAE's bias and error, the parts after the layer.
    split = {k: float(np.mean(margin(v))) for k, v in totals.items()} if f.is_pairs else None
    return {"layer": f.layer, "n_fired": len(f.features), "fvu": f.fvu, "relative_error": f.relative_error,
            "margin_split": split,
            "top_margin": [{"feature": i, "margin": v} for i, v in f.top(10, by="margin" if f.is_pairs else "mean")]}


_PAIR_KEYS = ("chosen", "rejected", "margin")
"""A summary pair's own keys: a record field of one of these names is written as `record.<name>`."""


def _parity(audit: Audit) -> list[ParityRow] | None:
    """The audit's parity checks (`Parity.to_frame`'s rows), or None when not run (`parity_note` says why)."""
    if audit.parity is None:
        return None
    return [cast(ParityRow, row) for row in audit.parity.to_frame().to_dict("records")]


def tables(audit: Audit) -> dict[str, pd.DataFrame]:
    """{name: pandas DataFrame} of every table the report writes as Parquet."""
    import pandas as pd

    chosen, rejected, margin = margins(audit)
    lens = audit.lens
    out = {
        "scores": pd.DataFrame({
            "index": np.arange(len(margin)), "pair": [str(p) for p in audit.pair_ids], "chosen": chosen,
            "rejected": rejected, "margin": margin, "chosen_wins": margin > 0,
            "counted": counted(audit).finite,
            **{f"crystallization_{kind}": depth for kind, depth in depths(audit).items()},
        }),
        "lens": lens.to_frame(), "sublayers": audit.sublayers.to_frame(), "heads": audit.heads.to_frame(),
        "faithfulness": audit.faithfulness.to_frame(),
        "faithfulness_summary": pd.DataFrame(audit.faithfulness.rows()),
    }
    if audit.probes is not None:
        out["probes"] = audit.probes.to_frame()
        out["probe_items"] = audit.probes.items_frame()
    if audit.concepts is not None:
        out["concepts"] = audit.concepts.to_frame()
        out["concept_dose"] = audit.concepts.dose_frame()
        out["concept_summary"] = pd.DataFrame(audit.concepts.rows())
    if audit.features is not None:
        out["features"] = audit.features.to_frame()
    names = labels(audit)
    if names is not None:
        out["scores"].insert(2, "subset", names)
        out["subsets"] = subsets_frame(audit)
    for name, column in audit.record_columns(list(out["scores"].columns)).items():  # joins back to the data by id
        if name not in out["scores"] and any(v is not None for v in column):  # no all-empty group column
            out["scores"][name] = column
    out["estimands"] = pd.DataFrame(more.estimands(audit))
    results = {"divergence": audit.divergence, "distortion": audit.distortion, "cascades": audit.cascades,
               "conflicts": audit.conflicts, "circuit": audit.circuit, "graphs": audit.graphs}
    out.update({name: r.to_frame() for name, r in results.items() if r is not None})
    if audit.tokens is not None:  # its rows are the attributed pairs' sides: name the audit's pairs
        frame = audit.tokens.to_frame()
        pair = {label: audit.pair_ids[audit.token_pairs[pair_of(r)[0]]] for r, label in enumerate(audit.tokens.rows)}
        frame.insert(0, "pair", frame["row"].map(pair))
        out["tokens"] = frame
    return out


def plain(x: Any) -> Any:
    """`x` with numpy scalars and arrays made Python values and non-finite floats made None (JSON null):
    `stats.json_ready`, the one rule every JSON output follows."""
    return json_ready(x)


def write_numbers(audit: Audit, out: Path, numbers: AuditSummary | None = None) -> dict[str, Any]:
    """Write one Parquet file per table and `numbers.json` (the summary plus `tables`) into `out`.

    Returns what `numbers.json` holds. `numbers`: a `summary(audit)` already computed.
    """
    doc: dict[str, Any] = dict(summary(audit) if numbers is None else numbers)
    listing = {}
    for name, frame in tables(audit).items():
        frame.to_parquet(out / f"{name}.parquet", index=False)
        listing[name] = {"file": f"{name}.parquet", "rows": len(frame), "columns": [str(c) for c in frame.columns]}
    doc["tables"] = listing  # numbers.json: the summary and the files its tables went into
    data = plain(doc)
    # Strict JSON (NaN and inf as null): a stray NaN literal is invalid JSON that strict readers reject.
    (out / "numbers.json").write_text(to_json(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return data
