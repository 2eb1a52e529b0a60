"""The margin graph of a pair: the chosen side's graph minus the rejected side's, node by node.

Nodes are matched across the sides by what they are — a feature by (layer, feature id), an error node by
its layer, a token by its token id — and by where they are, under one of two position rules:

- `align="prefix"` (default): positions inside the longest shared token prefix (the prompt, mostly) are
  the same position on both sides and match; positions after it are the side's own and never match (a
  response token of the chosen side is not "the same place" as one of the rejected side);
- `align="read"`: positions are counted back from the read token (`t* − p`), so the last tokens of both
  responses match each other, whatever their lengths.

A matched node's edges are subtracted (chosen − rejected); an unmatched node keeps its edges, with the
sign of its side (+ chosen, − rejected). The root is the margin `r_c − r_r`, its constant the difference
of constants, and the margin graph closes on the margin exactly as each side closes on its reward.
A matched feature's value and constant are differences too; its activation is `a_c − a_r`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..errors import UsageError
from ._graph import AttributionGraph, Nodes

Align = Literal["prefix", "read"]
ALIGNS: tuple[Align, ...] = ("prefix", "read")


def _keys(g: AttributionGraph, side: str, align: Align, prefix: int) -> list[tuple[object, ...]]:
    """Each node's matching key (module docstring)."""
    out: list[tuple[object, ...]] = []
    n = g.nodes
    for i in range(len(n.names)):
        kind, pos = int(n.kind[i]), int(n.position[i])
        if kind == 3:
            out.append(("root",))
            continue
        where: object = (g.read_at - pos) if align == "read" else (pos if pos < prefix else (side, pos))
        out.append((kind, int(n.layer[i]), int(n.feature[i]), where))
    return out


def shared_prefix(chosen: list[int], rejected: list[int]) -> int:
    """How many leading token ids the two sides share."""
    n = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        n += 1
    return n


def margin_graph(chosen: AttributionGraph, rejected: AttributionGraph, align: Align, prefix: int, label: str
                 ) -> AttributionGraph:
    """The margin graph (module docstring); `prefix`: the shared token prefix's length."""
    if align not in ALIGNS:
        raise UsageError(f"align must be one of {ALIGNS}, got {align!r}", option="align")
    kc, kr = _keys(chosen, "chosen", align, prefix), _keys(rejected, "rejected", align, prefix)
    order: dict[tuple[object, ...], int] = {}
    for key in sorted(set(kc) | set(kr), key=_rank):
        order[key] = len(order)
    n = len(order)
    mc, mr = np.array([order[k] for k in kc]), np.array([order[k] for k in kr])
    incoming_c, incoming_r = set(mc[chosen.rows].tolist()), set(mr[rejected.rows].tolist())
    row_nodes = sorted(incoming_c | incoming_r, key=lambda i: (i == n - 1, i))
    row_of = {node: i for i, node in enumerate(row_nodes)}
    adjacency = np.zeros((len(row_nodes), n), dtype=np.float64)
    for g, m, sign in ((chosen, mc, 1.0), (rejected, mr, -1.0)):
        np.add.at(adjacency, (np.array([row_of[int(m[r])] for r in g.rows])[:, None], m[None, :]),
                  sign * g.adjacency.astype(np.float64))
    scale = np.zeros(len(row_nodes))
    for g, m in ((chosen, mc), (rejected, mr)):
        side = np.abs(g.adjacency).astype(np.float64).sum(1) + np.abs(g.nodes.constant[g.rows])
        np.add.at(scale, np.array([row_of[int(m[r])] for r in g.rows]), side)
    nodes = _merge(chosen.nodes, rejected.nodes, mc, mr, n)
    tokens = chosen.tokens + rejected.tokens
    return AttributionGraph(nodes=nodes, adjacency=adjacency.astype(np.float32), rows=np.array(row_nodes),
                            tokens=tokens, label=label, basis=chosen.basis, n_layers=chosen.n_layers,
                            read_at=chosen.read_at, dropped=chosen.dropped + rejected.dropped,
                            meta={"align": align, "shared_prefix": prefix, "rejected_offset": len(chosen.tokens),
                                  "row_scale": scale})


def _rank(key: tuple[object, ...]) -> tuple[int, int, int, int, int]:
    """Circuit-tracer's node order: features, errors, tokens (each by layer, then position), the root last."""
    if len(key) == 1:
        return (4, 0, 0, 0, 0)
    kind, layer, feature, where = key
    group, pos = (0, where) if isinstance(where, int) else (1 if where[0] == "chosen" else 2, where[1])  # type: ignore[index]
    return int(kind), int(layer), group, int(pos), int(feature)  # type: ignore[call-overload]


def _merge(c: Nodes, r: Nodes, mc: np.ndarray, mr: np.ndarray, n: int) -> Nodes:
    """One node list: a matched node's value, constant and activation are chosen − rejected; a node of one
    side keeps its own (negated for the rejected side); a rejected-only node's name ends in `_rejected`."""
    in_c, in_r = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    in_c[mc], in_r[mr] = True, True
    side = np.where(in_c & in_r, "both", np.where(in_c, "chosen", "rejected")).astype(object)
    names = [""] * n
    for i, j in enumerate(mr):
        names[j] = r.names[i] if r.kind[i] == 3 else f"{r.names[i]}_rejected"
    for i, j in enumerate(mc):
        names[j] = c.names[i]
    cols = {}
    for f in ("kind", "layer", "position", "feature"):
        col = np.zeros(n, dtype=np.int64)
        col[mr], col[mc] = getattr(r, f), getattr(c, f)
        cols[f] = col
    nums = {}
    for f in ("activation", "value", "constant"):
        vc, vr = np.zeros(n), np.zeros(n)
        vc[mc], vr[mr] = getattr(c, f), getattr(r, f)
        nums[f] = vc - vr  # a NaN (a source's value) on either side stays NaN
    names[n - 1] = "margin"
    return Nodes(names, cols["kind"].astype(np.int8), cols["layer"], cols["position"], cols["feature"],
                 nums["activation"], nums["value"], nums["constant"], side=side)
