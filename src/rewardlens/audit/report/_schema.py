"""The audit summary's schema: one set of typed dicts that `summary` returns, `numbers.json` stores, the
page renders and `rewardlens audit` prints, so a key renamed in one place is a type error in the others.

The top levels are spelled out; sections whose inner tables are long and only rendered (probes,
concepts, subsets, the instruments beside the core) stay `dict[str, Any]` one level down.
"""

from __future__ import annotations

from typing import Any, TypedDict


class PairScore(TypedDict):
    """One pair's rewards: `margin` = chosen − rejected, in reward units. Its naming keys (`id`, `subset`,
    `group`) come from `rewardlens.data.record_fields`, and so do its record's other fields, under the user's
    names beyond these keys, so it joins back to the data by id."""

    id: str
    subset: str | None
    group: str | None
    chosen: float
    rejected: float
    margin: float


class ParityRow(TypedDict):
    """One parity check on the audit's pairs (`rewardlens.model.parity`): the largest |difference| between
    rewardlens' score and the model's own forward, the dtype's (scaled) tolerance, and the sequences compared."""

    name: str
    difference: float
    tolerance: float
    passed: bool
    n: int


class Scores(TypedDict):
    """Pair accuracy (chosen > rejected) with its Wilson interval, and the mean rewards, over the `counted`
    pairs (finite rewards and parts); `excluded` names the others, `saturated` says every counted margin
    is exactly 0, `notes` says both in words and `line` is the accuracy as one printed line."""

    accuracy: float
    ties: int
    correct: int
    accuracy_ci: list[float]
    counted: int
    excluded: list[str]
    saturated: bool
    notes: list[str]
    line: str
    mean_margin: float
    median_margin: float
    mean_chosen: float
    mean_rejected: float


class LensSummary(TypedDict):
    """Crystallization depth (l / L) of both lenses: median, interquartile range, pairs where defined."""

    fraction: float
    crystallization_median: dict[str, float]
    crystallization_iqr: dict[str, list[float]]
    crystallization_defined: dict[str, int]
    near_zero_margin_pairs: int


class Interval(TypedDict):
    """A mean per-pair Spearman ρ with its bootstrap interval and the pairs where it is defined."""

    rho: float
    lo: float
    hi: float
    pairs: int


class FaithfulnessSummary(TypedDict):
    """Attribution against each causal estimand, pooled over pairs, and the seed paper's statistic."""

    level: str
    mode: str
    n_parts: int
    pooled: dict[str, Interval]
    seed_statistic: dict[str, Any]
    paper_statistic: dict[str, Any] | None
    attribution_patching_agreement: dict[str, float]


class TopPart(TypedDict):
    """One of the top parts (`Faithfulness.top`): its mean attribution and effects over pairs."""

    part: str
    mean_abs_total_effect: float
    """The statistic the parts are ranked by (`stats.top_parts`): mean |total effect| over the counted pairs."""
    attribution: float
    total_effect: float
    direct_effect: float
    indirect_effect: float
    out_of_distribution_runs: int | None


class AuditSummary(TypedDict):
    """Every headline number of an audit (`summary(audit)`)."""

    rewardlens_version: str
    model: str
    fingerprint: str
    data_checksum: str
    provenance: dict[str, Any]
    n_pairs: int
    n_layers: int
    skipped: dict[str, str]
    pairs: list[PairScore]
    scores: Scores
    lens: LensSummary
    closure_error: dict[str, float]
    faithfulness: FaithfulnessSummary
    probes: dict[str, Any] | None
    concepts: dict[str, Any] | None
    features: dict[str, Any] | None
    subsets: dict[str, Any] | None
    top_parts: list[TopPart]
    estimands: list[dict[str, Any]]
    divergence: dict[str, Any] | None
    distortion: dict[str, Any] | None
    cascades: dict[str, Any] | None
    conflicts: dict[str, Any] | None
    tokens: dict[str, Any] | None
    steps: dict[str, Any] | None
    parity: list[ParityRow] | None
    parity_note: str | None
    parity_line: str | None
    circuit: dict[str, Any] | None
    """`Circuit.to_dict()` of the audit's circuit (`Plan(circuit=True)`), None when not run."""
    graphs: dict[str, Any] | None
    """`AuditGraphs.to_dict()` of the audit's attribution graphs (`Plan(graph=True)`), None when not run."""
    findings: dict[str, Any] | None
    """The audit's claims (`_findings.findings_summary`): the organism sentence, `min_pairs`, what each strength
    means, and each claim with its number, interval, pairs and strength; None only while `summary` builds it."""


class AuditResult(AuditSummary):
    """What `rewardlens audit` prints (`--json`): the summary, plus where the run's files are."""

    report: str
    store: str
    pairs_from_store: int | None
