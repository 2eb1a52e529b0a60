"""Verified edge scores: cheap scores propose, exact path patching scores the top candidates.

EAP and EAP-IG are first-order: on a saturated rule (patching one edge removes the whole margin) they
misjudge a large edge several-fold, and rank it below an exact edge into the reward (docs/circuits.md,
Verified edges). `verified_scores` takes the first `n` edges by mean |score| over pairs (the ranking
rule of `stats.top_parts`, which `Edges.top` and `circuit` use) and replaces every estimated score among
them by `path_patch`'s effect of that (sender, receiver), the same corruption (mode, ablation,
positions, reference), then ranks again; it stops once the first `n` edges of the ranking are all exact
(an edge into 'reward' is exact as scored), so an estimate that overshot cannot hold a place an exact
score would not. Each round verifies at least one new edge, so it ends; one `path_patch` call per
receiver per round, its senders batched (each (sender, receiver) cell is its own run, as alone).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from ..data import Inputs, Pair, pair_ids
from ..errors import CircuitError
from ..model import RewardModel
from ..stats import top_parts
from ..types import Ablation, Mode, Positions, Spans
from ._path import path_patch


def check_verify(n: int | None) -> int:
    """The number of edges to verify: None → 0 (no verification); an int ≥ 0 else (CircuitError)."""
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise CircuitError(f"verify is how many of the top edges to score by exact path patching, an int >= 0; "
                           f"got {n!r}; pass e.g. verify=10 (or None for the first-order scores alone)")
    return operator.index(n)


def verified_scores(
    model: RewardModel, pairs: Sequence[Pair], upstream: list[str], downstream: list[str], score: np.ndarray,
    exact: np.ndarray, n: int, *, ids: list[str], mode: Mode, ablation: Ablation, positions: Positions | Spans,
    reference: Inputs | None, batch_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores [n_pairs, U, D], path-patched [U, D]): `score` (NaN where no edge exists) with the estimated
    cells (`exact` False) among the first `n` by mean |score| path-patched, ranked again until the first
    `n` are all exact. `ids`: the pair ids the scores were made on (the pairs must be those)."""
    n = check_verify(n)
    if pair_ids(pairs) != list(ids):
        raise CircuitError(f"these edges were scored on {len(ids)} pairs ({list(ids)[:2]}...), not on the "
                           f"{len(pairs)} given; verify them on the pairs they were scored on")
    score, exact = score.astype(np.float64, copy=True), exact.copy()
    verified = np.zeros_like(exact)
    valid = ~np.isnan(score[0]) if len(score) else np.zeros(score.shape[1:], bool)
    cells = np.argwhere(valid)  # row-major, the order of score[:, valid]
    while n:
        top = [tuple(cells[i]) for i in top_parts(score[:, valid], n)]
        todo = [(i, j) for i, j in top if not exact[i, j]]
        if not todo:
            break
        for j in sorted({j for _, j in todo}):
            senders = [i for i, k in todo if k == j]
            run = path_patch(model, pairs, senders=[upstream[i] for i in senders], receivers=[downstream[j]],
                             mode=mode, ablation=ablation, positions=positions, reference=reference,
                             batch_size=batch_size)
            score[:, senders, j] = run.effect[:, :, 0]
            exact[senders, j] = verified[senders, j] = True
    return score, verified
