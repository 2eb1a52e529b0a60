"""The suite: every grader in order, and `calibrate`, which runs them on one shared bench."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..zoo.organisms import KIND_ORGANISMS as KINDS
from ..zoo.organisms.internal import ORGANISM_VERSION
from ._circuits import grade_circuits
from ._concepts import grade_concepts
from ._conflict import grade_conflict
from ._core import STRENGTHS, Grader, Scorecard
from ._editing import grade_editing
from ._graphs import grade_graphs
from ._instruments import grade_attribution, grade_lens, grade_organisms, grade_patching, grade_sae
from ._kinds import KindBench, grade_dpo, grade_prm
from ._neurons import grade_neurons
from ._probes import grade_distortion, grade_probes

GRADERS: list[Grader] = [grade_organisms, grade_attribution, grade_lens, grade_patching, grade_sae, grade_probes,
                         grade_distortion, grade_concepts, grade_conflict, grade_editing, grade_circuits,
                         grade_neurons, grade_graphs, grade_prm, grade_dpo]
"""The suite, in order. A new instrument appends its grader (before the PRM and DPO graders, which stay last)."""


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

    `graders` defaults to `GRADERS`; `organisms` to all of them, names of `ORGANISMS` and of `KINDS`
    (the PRM and DPO organisms; the circuit organism carries the localisation and strength checks).
    Organisms are built at `seed` and cached, so the first run trains them (about two minutes on one
    core) and later runs only evaluate. `n_pairs` held-out pairs per organism; `progress` receives a
    line before each organism is trained.
    """
    started = time.perf_counter()
    kinds = None if organisms is None else [n for n in organisms if n in KINDS]  # the PRM and DPO organisms
    rest = None if organisms is None else [n for n in organisms if n not in KINDS]
    bench = KindBench(seed=seed, n_pairs=n_pairs, strengths=strengths, organisms=rest, kinds=kinds, progress=progress)
    rows = tuple(row for grader in (GRADERS if graders is None else graders) for row in grader(bench))
    settings = {"seed": seed, "n_pairs": n_pairs, "strengths": list(bench.strengths),
                "organisms": list(bench.organisms) + list(bench.kinds), "organism_version": ORGANISM_VERSION,
                "seconds": round(time.perf_counter() - started, 1)}
    return Scorecard(rows, settings)
