"""`calibrate`: grade every instrument on model organisms, where the right answer is planted.

The suite is the list `GRADERS`. A grader takes the shared `Bench` (organisms built on demand,
loaded once, with held-out pairs) and returns `Grade` rows; an instrument joins the suite by
appending one grader. Each row states what was measured, the threshold and whether it passed,
so a scorecard reads as "this instrument finds what we planted, this well".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..organisms import VERSION
from .concepts import grade_concepts
from .conflict import grade_conflict
from .core import (
    STRENGTHS,
    Bench,
    Grade,
    Grader,
    Scorecard,
    localisation,
    strength_response,
)
from .editing import grade_editing
from .instruments import (
    grade_attribution,
    grade_lens,
    grade_organisms,
    grade_patching,
    grade_sae,
)
from .probes import grade_distortion, grade_probes

__all__ = ["GRADERS", "STRENGTHS", "Bench", "Grade", "Grader", "Scorecard", "calibrate", "localisation",
           "strength_response"]


GRADERS: list[Grader] = [grade_organisms, grade_attribution, grade_lens, grade_patching, grade_sae, grade_probes,
                         grade_distortion, grade_concepts, grade_conflict, grade_editing]
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
