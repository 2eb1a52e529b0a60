"""`calibrate`: grade every instrument on model organisms, where the right answer is planted.

The suite is the list `GRADERS`. A grader takes the shared `Bench` (organisms built on demand,
loaded once, with held-out pairs) and returns `Grade` rows; an instrument joins the suite by
appending one grader. Each row states what was measured, the threshold and whether it passed,
so a scorecard reads as "this instrument finds what we planted, this well".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .attribution import attribute
from .attribution_patching import attribution_patch
from .data import Pair
from .lens import lens
from .loading import load
from .model.core import RewardModel
from .organisms import ORGANISMS, VERSION, build
from .organisms.cache import READY, organism_dir
from .organisms.train import ablated, margins
from .patching import patch
from .stats import auroc, spearman

ACCURACY = 0.97
"""Held-out pair accuracy every organism must reach (share of rule-decided pairs ordered right)."""
STRENGTHS = (0.25, 0.5, 1.0)
"""The strength sweep: share of training pairs the rule decides (the rest are coin flips)."""


@dataclass(frozen=True)
class Grade:
    """One row of a scorecard: `instrument` measured `value` for `check` on `organism`; it passes
    when `value compare threshold` holds (`compare` is '>=', '<=' or '==')."""

    instrument: str
    organism: str
    check: str
    value: float
    threshold: float
    passed: bool
    compare: str = ">="

    @classmethod
    def of(cls, instrument: str, organism: str, check: str, value: float, threshold: float,
           compare: str = ">=") -> Grade:
        ok = {">=": value >= threshold, "<=": value <= threshold, "==": value == threshold}[compare]
        return cls(instrument, organism, check, float(value), float(threshold), bool(ok and np.isfinite(value)), compare)


@dataclass(frozen=True)
class Scorecard:
    """Every grade of one calibration run, with the settings it ran under (`settings`)."""

    rows: tuple[Grade, ...]
    settings: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether every check passed."""
        return all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[Grade]:
        return [r for r in self.rows if not r.passed]

    def to_frame(self):
        """One row per grade: instrument, organism, check, value, compare, threshold, passed."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.rows],
                            columns=["instrument", "organism", "check", "value", "threshold", "passed", "compare"])

    def to_dict(self) -> dict:
        return {"passed": self.passed, "settings": self.settings, "rows": [asdict(r) for r in self.rows]}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The scorecard as JSON text; also written to `path` when one is given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).expanduser().write_text(text + "\n", encoding="utf-8")
        return text


class Bench:
    """What the graders of one run share: organisms built on demand (cached on disk by `build`),
    loaded models, and held-out pairs (`spec.pairs(n_pairs, seed=seed + 1)`, planted strength 1,
    a stream neither training nor the build's own accuracy check used)."""

    def __init__(self, *, seed: int = 0, n_pairs: int = 100, strengths: Sequence[float] = STRENGTHS,
                 organisms: Sequence[str] | None = None, progress: Callable[[str], None] | None = None) -> None:
        unknown = sorted(set(organisms or ()) - set(ORGANISMS))
        if unknown:
            raise ValueError(f"no organism named {unknown}; choose from {sorted(ORGANISMS)}")
        if (len(strengths) < 3 or sorted(strengths) != list(strengths) or len(set(strengths)) != len(strengths)
                or not all(0 < s <= 1 for s in strengths)):
            raise ValueError(f"strengths must be at least 3 increasing values in (0, 1], got {list(strengths)}")
        if n_pairs < 10:
            raise ValueError(f"n_pairs must be at least 10 for accuracies to mean anything, got {n_pairs}")
        self.seed, self.n_pairs, self.strengths = seed, n_pairs, tuple(float(s) for s in strengths)
        self.organisms = tuple(organisms) if organisms is not None else tuple(ORGANISMS)
        self.progress = progress or (lambda message: None)
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


Grader = Callable[[Bench], list[Grade]]


def circuits(bench: Bench) -> list[str]:
    """The organisms on the bench whose rule lives in a known part."""
    return [n for n in bench.organisms if ORGANISMS[n].planted_part is not None]


def sublayer_of(part: str) -> str:
    """`attn_L1_H2` → `attn_L1`: the sublayer a head or neuron belongs to."""
    return "_".join(part.split("_")[:2])


def localisation(instrument: str, organism: str, names: Sequence[str], scores: np.ndarray, planted: str,
                 level: str, by: str = "mean margin") -> list[Grade]:
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


def strength_response(bench: Bench, instrument: str, organism: str, what: str,
                      score: Callable[[RewardModel], float]) -> Grade:
    """Row for "does `instrument` respond monotonically to planted strength": Spearman between the
    bench's strengths and `score` of the organism trained at each (must be 1)."""
    sweep = [score(bench.model(organism, s)) for s in bench.strengths]
    return Grade.of(instrument, organism, f"Spearman(strength, {what}) over {len(sweep)} strengths",
                    spearman(bench.strengths, sweep), 1.0)


# ---- graders ------------------------------------------------------------------------------------

def grade_organisms(bench: Bench) -> list[Grade]:
    """The answer key itself: every organism learned its rule (held-out accuracy), and the circuit
    organism's rule lives only in its planted part (ablating it removes the margin)."""
    rows = []
    for name in bench.organisms:
        spec, model = ORGANISMS[name], bench.model(name)
        pairs = bench.pairs(name)
        values = model.objectives(pairs)
        labels, diff = spec.labels(pairs), values[0::2] - values[1::2]
        for k, objective in enumerate(spec.objectives):
            decided = labels[:, k] != 0
            acc = float(np.mean(np.sign(diff[decided, k]) == labels[decided, k]))
            what = "held-out pair accuracy" + (f" ({objective})" if len(spec.objectives) > 1 else "")
            rows.append(Grade.of("organism", name, what, acc, ACCURACY))
    for name in circuits(bench):
        part, model, pairs = ORGANISMS[name].planted_part, bench.model(name), bench.pairs(name)
        full = margins(model.model, model.tokenizer, pairs)[:, 0].mean()
        cut = margins(ablated(model.model, part), model.tokenizer, pairs)[:, 0].mean()
        rows.append(Grade.of("organism", name, f"|mean margin| left with {part} ablated, as a share",
                             abs(cut / full), 0.05, "<="))
    return rows


def grade_attribution(bench: Bench) -> list[Grade]:
    """Exact attribution: closes on every organism; ranks the planted part first at sublayer and
    head level; its contribution rises with planted strength (Spearman = 1)."""
    rows = []
    for name in bench.organisms:
        att = attribute(bench.model(name), bench.pairs(name)[:20])
        rows.append(Grade.of("attribution", name, "max |reward - (sum of parts + constant)|",
                             float(np.abs(att.residual_error).max()), 1e-4, "<="))
    for name in circuits(bench):
        part, pairs = ORGANISMS[name].planted_part, bench.pairs(name)
        for level, target in (("sublayer", sublayer_of(part)), ("head", part)):
            att = attribute(bench.model(name), pairs, level=level)
            rows += localisation("attribution", name, att.names, att.margin.mean(0), target, level)

        def on_part(model: RewardModel, part: str = part, pairs: list[Pair] = pairs) -> float:
            att = attribute(model, pairs, level="head")
            return float(att.margin.mean(0)[att.names.index(part)])

        rows.append(strength_response(bench, "attribution", name, f"mean margin on {part}", on_part))
    return rows


def grade_lens(bench: Bench) -> list[Grade]:
    """Reward lens: the final linear-lens margin rises with planted strength, and on a circuit
    planted in layer l the margin crystallizes after layer l, not before."""
    rows = []
    for name in circuits(bench):
        part, pairs = ORGANISMS[name].planted_part, bench.pairs(name)
        rows.append(strength_response(bench, "lens", name, "final linear-lens margin",
                                      lambda m, pairs=pairs: float(lens(m, pairs).margin("linear")[:, -1].mean())))
        model = bench.model(name)
        layer = int(part.split("_")[1][1:])
        depth = np.nanmedian(lens(model, pairs).crystallization("linear", 0.5))
        rows.append(Grade.of("lens", name, "median crystallization depth (linear, fraction 0.5)",
                             depth, (layer + 1) / model.n_layers, "=="))
    return rows


def grade_patching(bench: Bench) -> list[Grade]:
    """Causal patching: read-position noising (total and path-frozen direct) and attribution
    patching rank the planted part first at sublayer and head level, and the planted head's
    noising effect rises with planted strength (Spearman = 1)."""
    rows = []
    for name in circuits(bench):
        part, pairs = ORGANISMS[name].planted_part, bench.pairs(name)[:40]
        model = bench.model(name)
        for level, target in (("sublayer", sublayer_of(part)), ("head", part)):
            for instrument, result in (
                ("patching", patch(model, pairs, level=level)),
                ("path-frozen patching", patch(model, pairs, level=level, estimand="direct")),
                ("attribution patching", attribution_patch(model, pairs, level=level)),
            ):
                rows += localisation(instrument, name, result.names, result.effect.mean(0), target, level,
                                     by="mean noising effect")

        def effect(model: RewardModel, part: str = part, pairs: list[Pair] = pairs) -> float:
            result = patch(model, pairs, level="head")
            return float(result.effect.mean(0)[result.names.index(part)])

        rows.append(strength_response(bench, "patching", name, f"mean noising effect of {part}", effect))
    return rows


def grade_sae(bench: Bench) -> list[Grade]:
    """TopK SAE on the 'list' organism's last layer: the features that write the most reward on
    held-out pairs detect the bullet list on pairs where a coin put it on either side (AUROC), and
    do not detect which side was chosen (AUROC near 0.5)."""
    from .sae import SAEConfig
    from .sae_attribution import attribute_features
    from .sae_data import ActivationSource
    from .sae_train import TrainConfig, train_sae

    if "list" not in bench.organisms:
        return []
    spec, model = ORGANISMS["list"], bench.model("list")
    layer = model.n_layers - 1
    source = ActivationSource(model, spec.pairs(n=200, seed=bench.seed + 2, strength=1.0), f"resid_{layer}",
                              positions="all")
    with torch.random.fork_rng():  # seeded training without resetting the caller's random state
        torch.manual_seed(bench.seed)
        sae = train_sae(source, TrainConfig(sae=SAEConfig(expansion_factor=4, k=8), batch_size=256, epochs=3)).sae
    top = [f for f, _ in attribute_features(model, sae, bench.pairs("list")[:60], layer=layer).top(3, by="margin")]
    mixed_pairs = spec.pairs(n=100, seed=bench.seed + 3, strength=0.0)
    mixed = attribute_features(model, sae, mixed_pairs, layer=layer)
    has_list = np.array([spec.has_attribute(t) for p in mixed_pairs for t in (p.chosen, p.rejected)])
    is_chosen = np.arange(len(has_list)) % 2 == 0
    rows = []
    for rank, feature in enumerate(top, 1):
        column = list(mixed.features).index(feature) if feature in mixed.features else None
        acts = mixed.activations[:, column] if column is not None else np.zeros(len(has_list))
        rows.append(Grade.of("sae", "list", f"AUROC of reward feature #{rank} for the planted attribute",
                             auroc(acts, has_list), 0.95))
        rows.append(Grade.of("sae", "list", f"|AUROC − 0.5| of reward feature #{rank} for the chosen side",
                             abs(auroc(acts, is_chosen) - 0.5), 0.25, "<="))
    return rows


GRADERS: list[Grader] = [grade_organisms, grade_attribution, grade_lens, grade_patching, grade_sae]
"""The suite, in order. A new instrument appends its grader."""


def calibrate(
    *,
    graders: Sequence[Grader] | None = None,
    organisms: Sequence[str] | None = None,
    seed: int = 0,
    n_pairs: int = 100,
    strengths: Sequence[float] = STRENGTHS,
    progress: Callable[[str], None] | None = None,
) -> Scorecard:
    """Grade the instruments on model organisms whose truth is planted; returns a `Scorecard`.

    `graders` defaults to `GRADERS`; `organisms` to all of them (the circuit organism carries the
    localisation and strength checks). Organisms are built at `seed` and cached, so the first run
    trains them (about two minutes on one core) and later runs only evaluate. `n_pairs`
    held-out pairs per organism; `progress` receives a line before each organism is trained.
    """
    started = time.perf_counter()
    bench = Bench(seed=seed, n_pairs=n_pairs, strengths=strengths, organisms=organisms, progress=progress)
    rows = tuple(row for grader in (GRADERS if graders is None else graders) for row in grader(bench))
    settings = {"seed": seed, "n_pairs": n_pairs, "strengths": list(bench.strengths),
                "organisms": list(bench.organisms), "organism_version": VERSION,
                "seconds": round(time.perf_counter() - started, 1)}
    return Scorecard(rows, settings)
