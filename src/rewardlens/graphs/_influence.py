"""Influence on the reward through the graph, pruning, and the replacement and completeness scores.

The definitions are circuit-tracer's (Ameisen et al. 2025), on an adjacency held as its target rows only:
`A` [R, N] has one row per node that has incoming edges (features, then the reward) and one column per
node (features, errors, tokens, reward); `rows[i]` is row i's node. Nodes without a row (errors, tokens)
have no incoming edges, so this is the square matrix with its zero rows left out — never [N × N].

- normalised adjacency `Â = |A| / Σ_row |A|` (each target's incoming edges as shares);
- influence `I = w Â + w Â² + …` with `w` the reward's weight (1 on the reward node): each node's share
  of the reward through every path, summed until the series stops (the graph is acyclic);
- prune: keep the nodes that carry `node_threshold` of the total influence (tokens and the reward are
  always kept), then the edges whose score `Â[t, s] · (I_t + w_t)` carries `edge_threshold` of the total,
  then drop features and errors left without an outgoing edge and features without an incoming one;
- replacement score: `I(tokens) / (I(tokens) + I(errors))`;
- completeness score: `Σ_n (1 − Σ_errors Â[n, ·]) (I_n + w_n) / Σ_n (I_n + w_n)`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import UsageError


def normalise(adjacency: Tensor) -> Tensor:
    """`|A|` with each row divided by its sum (rows summing to 0 stay 0)."""
    a = adjacency.abs()
    return a / a.sum(1, keepdim=True).clamp_min(1e-10)


def influence(normalised: Tensor, rows: Tensor, weights: Tensor, max_iter: int = 1000) -> Tensor:
    """`w Â + w Â² + …` [N] on the row-only adjacency (module docstring)."""
    current = weights[rows] @ normalised
    total = current.clone()
    for _ in range(max_iter):
        current = current[rows] @ normalised
        if not bool(current.any()):
            return total
        total += current
    raise RuntimeError(f"influence did not converge in {max_iter} steps: the graph has a cycle")


def threshold(scores: Tensor, share: float) -> Tensor:
    """The smallest score among the top scores that together carry `share` of the total."""
    ordered = scores.flatten().sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum().clamp_min(1e-30)
    index = int(torch.searchsorted(cumulative, torch.tensor(share, dtype=cumulative.dtype)).item())
    return ordered[min(index, len(ordered) - 1)]


def prune_masks(adjacency: Tensor, rows: Tensor, weights: Tensor, kinds: Tensor, node_threshold: float,
                edge_threshold: float) -> tuple[Tensor, Tensor, Tensor]:
    """(node mask [N], edge mask [R, N], cumulative influence share [N]). `kinds` [N]: 0 feature, 1 error,
    2 token, 3 reward."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise UsageError(f"{name} must be in [0, 1], got {value}", option=name)
    node_influence = influence(normalise(adjacency), rows, weights)
    keep = node_influence >= threshold(node_influence, node_threshold)
    keep |= kinds >= 2
    pruned = adjacency.clone()
    pruned[~keep[rows]] = 0
    pruned[:, ~keep] = 0
    normalised = normalise(pruned)
    scores = normalised * (influence(normalised, rows, weights) + weights)[rows][:, None]
    edges = scores >= threshold(scores, edge_threshold)
    sources, features = kinds <= 1, kinds[rows] == 0
    while True:
        before = keep.clone()
        edges[~keep[rows]] = False
        edges[:, ~keep] = False
        keep[sources] &= edges[:, sources].any(0)
        has_in = torch.zeros_like(keep)
        has_in[rows[features]] = edges[features].any(1)
        keep[kinds == 0] &= has_in[kinds == 0]
        if bool((keep == before).all()):
            break
    ordered, order = node_influence.sort(descending=True)
    share = torch.zeros_like(node_influence)
    share[order] = ordered.cumsum(0) / ordered.sum().clamp_min(1e-30)
    return keep, edges, share


def scores(adjacency: Tensor, rows: Tensor, weights: Tensor, kinds: Tensor) -> tuple[float, float]:
    """(replacement score, completeness score) as circuit-tracer defines them (module docstring)."""
    normalised = normalise(adjacency)
    node_influence = influence(normalised, rows, weights)
    tokens, errors = node_influence[kinds == 2].sum(), node_influence[kinds == 1].sum()
    replacement = float(tokens / (tokens + errors)) if float(tokens + errors) > 0 else float("nan")
    output = node_influence + weights
    error_share = normalised[:, kinds == 1].sum(-1)
    completeness = float((output.sum() - (error_share * output[rows]).sum()) / output.sum())
    return replacement, completeness
