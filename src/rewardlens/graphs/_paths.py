"""The strongest token → reward paths of an attribution graph.

A path's score is the product of the normalised edge shares along it (`Â[t, s]`, each target's incoming
edges as fractions of their total |weight|): the share of the reward's attribution that flows along that
path, as the influence series sums it over all paths. Its sign is the product of the edges' signs. Found by
keeping, at every node from the reward down, its `k` best partial paths (exact for the top `k`).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

from ..errors import UsageError
from ._influence import normalise

if TYPE_CHECKING:
    from ._shape import GraphLike

Path = tuple[float, float, tuple[int, ...]]  # (share, sign, nodes from this node up to the root)


def top_paths(g: GraphLike, k: int) -> list[tuple[list[str], float]]:
    """The `k` best token → reward paths as (node names from the token to the reward, signed share)."""
    import torch

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UsageError(f"k must be a positive number of paths, got {k!r}", option="k")
    shares = normalise(torch.from_numpy(g.adjacency.astype(np.float64))).numpy()
    signs = np.sign(g.adjacency)
    best: dict[int, list[Path]] = {g.root: [(1.0, 1.0, (g.root,))]}
    order = sorted(range(len(g.rows)), key=lambda i: -int(g.nodes.layer[g.rows[i]]))  # the reward first
    for i in order:
        node = int(g.rows[i])
        sources = np.nonzero(shares[i])[0]
        for share, sign, path in best.get(node, []):
            for j in sources:
                entry = (share * float(shares[i, j]), sign * float(signs[i, j]), (int(j), *path))
                heap = best.setdefault(int(j), [])
                if len(heap) < k:
                    heapq.heappush(heap, entry)
                elif entry[0] > heap[0][0]:
                    heapq.heapreplace(heap, entry)
    tokens = [p for j in np.nonzero(g.nodes.kind == 2)[0] for p in best.get(int(j), [])]
    tokens.sort(key=lambda p: -p[0])
    return [([g.nodes.names[n] for n in path], share * sign) for share, sign, path in tokens[:k]]
