"""What every grader shares: `Grade` rows, the `Scorecard`, the `OrganismBench` of organisms, and the
reusable checks (`localisation`, `strength_response`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

from ..data import Pair
from ..errors import UsageError
from ..model import Part, RewardModel, load
from ..plotting import HtmlView
from ..stats import spearman
from ..types import Level
from ..zoo.organisms import ORGANISMS, build
from ..zoo.organisms.internal import READY, organism_dir

if TYPE_CHECKING:
    import pandas as pd

ACCURACY = 0.97
"""Held-out pair accuracy every organism must reach (share of rule-decided pairs ordered right)."""
STRENGTHS = (0.25, 0.5, 1.0)
"""The strength sweep: share of training pairs the rule decides (the rest are coin flips)."""
Compare = Literal[">=", "<=", "=="]
"""How a grade's value must relate to its threshold."""


@runtime_checkable
class QualitySpec(Protocol):
    """An organism with a quality rule and a planted bias (the zoo's quality organisms, 'quality_list')."""

    bias_name: str

    def quality_pairs(self, n: int = 200, seed: int = 0) -> list[Pair]: ...

    def bias_pairs(self, n: int = 200, seed: int = 0, strength: float = 1.0) -> list[Pair]: ...


@dataclass(frozen=True)
class Grade:
    """One row of a scorecard: `instrument` measured `value` for `check` on `organism`; it passes
    when `value compare threshold` holds (`compare` is '>=', '<=' or '=='). `known` names a known
    limitation (why the instrument is expected to miss this threshold, and where the docs say so):
    such a row is measured and printed like any other, but its failure does not fail the scorecard."""

    instrument: str
    organism: str
    check: str
    value: float
    threshold: float
    passed: bool
    compare: Compare = ">="
    known: str = ""

    @classmethod
    def of(cls, instrument: str, organism: str, check: str, value: float, threshold: float,
           compare: Compare = ">=", known: str = "") -> Grade:
        ok = {">=": value >= threshold, "<=": value <= threshold, "==": value == threshold}[compare]
        return cls(instrument, organism, check, float(value), float(threshold), bool(ok and np.isfinite(value)),
                   compare, known)

    @property
    def result(self) -> str:
        """'pass', 'FAIL', or 'known' (a known limitation that failed, as expected)."""
        return "pass" if self.passed else "known" if self.known else "FAIL"


@dataclass(frozen=True)
class Scorecard(HtmlView):
    """Every grade of one calibration run, with the settings it ran under (`settings`)."""

    rows: tuple[Grade, ...]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether every check passed, known limitations (`Grade.known`) aside."""
        return not self.failures

    @property
    def failures(self) -> list[Grade]:
        """The checks that failed, known limitations aside."""
        return [r for r in self.rows if not r.passed and not r.known]

    @property
    def known_failures(self) -> list[Grade]:
        """The known limitations that failed, as expected: measured and reported, not counted."""
        return [r for r in self.rows if not r.passed and r.known]

    def to_frame(self) -> pd.DataFrame:
        """One row per grade: instrument, organism, check, value, compare, threshold, passed, known."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.rows],
                            columns=["instrument", "organism", "check", "value", "threshold", "passed", "compare",
                                     "known"])

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "settings": self.settings, "rows": [asdict(r) for r in self.rows]}

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The scorecard as JSON text; also written to `path` when one is given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).expanduser().write_text(text + "\n", encoding="utf-8")
        return text


class OrganismBench:
    """What the graders of one run share: organisms built on demand (cached on disk by `build`),
    loaded models, and held-out pairs (`spec.pairs(n_pairs, seed=seed + 1)`, planted strength 1,
    a stream neither training nor the build's own accuracy check used)."""

    def __init__(self, *, seed: int = 0, n_pairs: int = 100, strengths: Sequence[float] = STRENGTHS,
                 organisms: Sequence[str] | None = None, progress: Callable[[str], None] | None = None) -> None:
        unknown = sorted(set(organisms or ()) - set(ORGANISMS))
        if unknown:
            raise UsageError(f"no organism named {unknown}; choose from {sorted(ORGANISMS)}")
        if (len(strengths) < 3 or sorted(strengths) != list(strengths) or len(set(strengths)) != len(strengths)
                or not all(0 < s <= 1 for s in strengths)):
            raise UsageError(f"strengths must be at least 3 increasing values in (0, 1], got {list(strengths)}")
        if n_pairs < 10:
            raise UsageError(f"n_pairs must be at least 10 for accuracies to mean anything, got {n_pairs}")
        self.seed, self.n_pairs, self.strengths = seed, n_pairs, tuple(float(s) for s in strengths)
        self.organisms = tuple(organisms) if organisms is not None else tuple(ORGANISMS)
        self.progress = progress or (lambda _message: None)  # the default says nothing
        self._models: dict[tuple[str, float], RewardModel] = {}
        self._pairs: dict[str, list[Pair]] = {}

    def model(self, name: str, strength: float = 1.0) -> RewardModel:
        """The organism as `rewardlens.load` opens it (objective 0 as the readout when k > 1)."""
        key = (name, float(strength))
        if key not in self._models:
            if not (organism_dir(name, strength, self.seed) / READY).exists():
                self.progress(f"training organism {name!r} (strength {strength:g}, seed {self.seed}) ...")
            path = build(name, strength=strength, seed=self.seed)
            readout = 0 if len(ORGANISMS[name].objectives) > 1 else None
            self._models[key] = load(str(path), readout=readout)
        return self._models[key]

    def pairs(self, name: str) -> list[Pair]:
        if name not in self._pairs:
            self._pairs[name] = ORGANISMS[name].pairs(self.n_pairs, seed=self.seed + 1, strength=1.0)
        return self._pairs[name]


Grader = Callable[[OrganismBench], list[Grade]]


def circuits(bench: OrganismBench) -> list[str]:
    """The organisms on the bench whose rule lives in a known part."""
    return [n for n in bench.organisms if ORGANISMS[n].planted_part is not None]


def sublayer_of(part: str) -> str:
    """`attn_L1_H2` → `attn_L1`: the sublayer a head or neuron belongs to."""
    return Part.parse(part).sublayer.name


def localisation(instrument: str, organism: str, names: Sequence[str], scores: np.ndarray, planted: str,
                 level: Level, by: str = "mean margin") -> list[Grade]:
    """Rows for "does `instrument` find `planted`": its rank among `names` by `scores` [n_parts]
    (a mean per part, signed so that larger carries more of the preference; `by` names it) and
    its signed share of the total magnitude Σ|scores| (at most 1, and near 1 only when the planted
    part carries nearly all of it: a signed total can cancel to near zero). Reusable by any
    instrument that scores parts."""
    scores = np.asarray(scores, dtype=np.float64)
    order = [names[i] for i in np.argsort(-scores, kind="stable")]
    total = np.abs(scores).sum()
    share = float(scores[list(names).index(planted)] / total) if total > 0 else float("nan")
    return [Grade.of(instrument, organism, f"rank of {planted} by {by} ({level} level)",
                     order.index(planted) + 1, 1, "<="),
            Grade.of(instrument, organism, f"share of the |{by}| on {planted} ({level} level)", share, 0.9)]


def strength_response(bench: OrganismBench, instrument: str, organism: str, what: str,
                      score: Callable[[RewardModel], float]) -> Grade:
    """Row for "does `instrument` respond monotonically to planted strength": Spearman between the
    bench's strengths and `score` of the organism trained at each (must be 1)."""
    sweep = [score(bench.model(organism, s)) for s in bench.strengths]
    return Grade.of(instrument, organism, f"Spearman(strength, {what}) over {len(sweep)} strengths",
                    spearman(np.asarray(bench.strengths), np.asarray(sweep)), 1.0)
