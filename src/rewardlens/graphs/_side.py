"""One sequence's attribution graph: freeze, pick the feature nodes by influence, assemble the adjacency.

Node selection is circuit-tracer's: the reward's row first, then, in batches, the not-yet-visited
features with the largest estimated influence on the reward (the power series over the rows computed so
far), re-estimated each time the visited set doubles, until `max_nodes` features have rows. Features
past the cap are not dropped from the arithmetic: their edges are added to the error node at their layer
and position, so every target still closes (the error node is then "all of the MLP at this position that
the graph does not show": its reconstruction error plus the features past the cap).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import UsageError
from ..model import Part, RewardModel, TraceKey
from ..model.internal import Batch
from ._frozen import Frozen
from ._graph import KINDS, AttributionGraph, Nodes
from ._influence import influence
from ._rows import Rows, Target


def side_graph(model: RewardModel, batch: Batch, basis: Any, *, max_nodes: int, batch_size: int, label: str
               ) -> AttributionGraph:
    """The attribution graph of the one sequence in `batch` (module docstring)."""
    frozen = Frozen(model, batch, basis)
    if hasattr(basis, "probe"):
        basis.probe(frozen)
    run = frozen.forward(copies=batch_size)
    captured = model.run(batch, model.final_points(batch))
    out, coef = model.head_readout(captured, batch)
    u, head_const = readout_vector(model, captured, batch, coef)
    t_star = int(batch.read_index[0])
    zero = frozen.forward(zero=True)
    rows = Rows(frozen, run, u, t_star)
    if rows.n_features == 0:
        raise UsageError(f"{label}: no feature is active on any token, so the graph would hold only error nodes; "
                         "check that the transcoders belong to this model (their fidelity)", option="transcoders")
    computed, row_cols = _select(rows, max_nodes, batch_size)
    assert run.final is not None and zero.final is not None
    root_value = float((out * coef).sum())
    root_const = float(u @ zero.final[0, t_star].float() + head_const)
    return _assemble(model, batch, rows, computed, row_cols, (root_value, root_const), label, run, zero)


def readout_vector(model: RewardModel, captured: dict[Any, Tensor], batch: Batch, coef: Tensor
                   ) -> tuple[Tensor, Tensor]:
    """`(u [d], c)`: the reward is `u · x + c` for the residual `x` the head reads at `t*` (the final norm's
    input, its scale frozen), the head's rows contracted with the readout `coef` (exact/_decompose.py's
    read-out, before any walk back through the layers)."""
    x = captured[TraceKey.final()]
    head_rows, bias = model.head_rows(model.final_hidden(x), batch)
    u, const = (coef[..., None] * head_rows).sum(1, keepdim=True), (coef * bias).sum(-1, keepdim=True)
    if model.arch.final_norm is not None:
        u, c = model.norm(model.arch.final_norm).pullback(u, x)
        const = const + c
    return u[0, 0], const[0, 0]


def _select(rows: Rows, cap: int, batch_size: int) -> tuple[Tensor, list[int]]:
    """Rows [R, n_columns] (the reward's first, then the visited features') and each row's column
    (the reward's is `n_columns`).

    Each estimate fixes the next window of features to visit (the most influential, enough to double the
    visited set); the window is computed in batches sorted by layer, so a batch's backward pass stops at its
    highest target's layer, and its rows are put back in influence order (the estimates see the same matrix)."""
    goal = min(cap, rows.n_features)
    first = rows([Target(-1)])
    matrix = first.new_empty(goal + 1, rows.n_columns)  # filled window by window: no copy of the rows so far
    matrix[0] = first[0]
    row_cols = [rows.n_columns]
    visited = torch.zeros(rows.n_features, dtype=torch.bool)
    while len(row_cols) - 1 < goal:
        done = len(row_cols) - 1
        estimate = _estimate(matrix[: done + 1], row_cols)[: rows.n_features].cpu()
        estimate[visited] = -1.0
        order = estimate.argsort(descending=True)
        update_at = max(2 * done, batch_size)
        span = -(-(update_at - done) // batch_size) * batch_size  # whole batches up to the next estimate
        window = [int(c) for c in order[: min(span, goal - done, int((~visited).sum()))]]
        _window_rows(rows, window, batch_size, matrix[done + 1: done + 1 + len(window)])
        row_cols += window
        visited[window] = True
    return matrix, row_cols


def _estimate(matrix: Tensor, row_cols: list[int]) -> Tensor:
    """Each column's influence on the reward through the rows so far (`influence` on the normalised rows, with a
    zero column for the reward), built in one buffer: the rows are held once more, not three times."""
    n = matrix.shape[1]
    padded = matrix.new_empty(len(matrix), n + 1)
    torch.abs(matrix, out=padded[:, :n])
    padded[:, n] = 0.0
    padded[:, :n] /= padded[:, :n].sum(1, keepdim=True).clamp_min(1e-10)  # normalise(), in place
    weights = matrix.new_zeros(n + 1)
    weights[-1] = 1.0
    return influence(padded, torch.tensor(row_cols), weights)


def _window_rows(rows: Rows, window: list[int], batch_size: int, out: Tensor) -> None:
    """Write into `out` the rows of feature columns `window`, in that order, computed in batches of columns
    sorted by layer."""
    by_layer = sorted(range(len(window)), key=lambda i: window[i])  # columns are layer-major
    for start in range(0, len(by_layer), batch_size):
        part = by_layer[start: start + batch_size]
        out[torch.tensor(part, device=out.device)] = rows([rows.feature_of(window[i]) for i in part])


def _assemble(model: RewardModel, batch: Batch, rows: Rows, matrix: Tensor, row_cols: list[int],
              root: tuple[float, float], label: str, run: Any, zero: Any) -> AttributionGraph:
    basis, n_feat = rows.basis, rows.n_features
    chosen = sorted(c for c in row_cols if c < n_feat)
    dropped = torch.ones(n_feat, dtype=torch.bool)
    dropped[chosen] = False
    errors = matrix[:, n_feat: n_feat + rows.n_errors].clone()
    if bool(dropped.any()):  # features past the cap join the error node at their layer and position
        cols = dropped.nonzero().flatten()
        layer_of = torch.repeat_interleave(torch.arange(len(rows.counts)), torch.tensor(rows.counts))
        pos_of = torch.cat([basis.active[layer].pos.cpu() for layer in rows.layers])
        spot = (layer_of * rows.length + pos_of)[cols].to(errors.device)
        for chunk in torch.arange(len(cols)).split(4096):  # a few columns at a time: no copy of the whole block
            errors.index_add_(1, spot[chunk.to(spot.device)], matrix[:, cols[chunk].to(matrix.device)])
    keep_errors = basis.has_errors() or bool(dropped.any())
    blocks = [matrix[:, chosen], *([errors] if keep_errors else []), matrix[:, n_feat + rows.n_errors:]]
    adjacency = torch.cat([*blocks, matrix.new_zeros(len(matrix), 1)], 1)
    where = {c: i for i, c in enumerate(row_cols)}
    adjacency = adjacency[[where[c] for c in chosen] + [where[rows.n_columns]]]
    nodes = _nodes(model, batch, rows, chosen, keep_errors, root, run, zero)
    n = len(nodes.kind)
    row_nodes = np.array([*range(len(chosen)), n - 1])
    tokens = model.tokenizer.convert_ids_to_tokens(batch.input_ids[0].tolist())
    return AttributionGraph(nodes=nodes, adjacency=adjacency.cpu().numpy(), rows=row_nodes, tokens=list(tokens),
                            label=label, basis=basis.name, n_layers=model.n_layers, read_at=rows.read_at,
                            dropped=int(dropped.sum()))


def _nodes(model: RewardModel, batch: Batch, rows: Rows, chosen: list[int], errors: bool, root: tuple[float, float],
           run: Any, zero: Any) -> Nodes:
    basis, length, nan = rows.basis, rows.length, float("nan")
    cols: dict[str, list[Any]] = {k: [] for k in ("names", "kind", "layer", "pos", "feat", "act", "value", "const")}

    def add(name: str, kind: int, layer: int, pos: int, feat: int, act: float = nan, value: float = nan,
            const: float = nan) -> None:
        for key, v in zip(cols, (name, kind, layer, pos, feat, act, value, const)):
            cols[key].append(v)

    targets = [rows.feature_of(c) for c in chosen]
    totals = _feature_totals(rows, targets, run, zero)
    for i, t in enumerate(targets):
        a = basis.active[t.layer]
        p, f = int(a.pos[t.index]), int(a.ids[t.index])
        add(basis.part(t.layer, f).at(p).name, 0, t.layer, p, f, float(a.acts[t.index]), *totals[i])
    if errors:
        for lay in rows.layers:
            for p in range(length):
                add(basis.error_part(lay).at(p).name, 1, lay, p, -1)
    for p in range(length):
        add(Part.embed().at(p).name, 2, -1, p, int(batch.input_ids[0, p]))
    add("reward", 3, model.n_layers, rows.read_at, -1, nan, *root)
    return Nodes(names=cols["names"], kind=np.array(cols["kind"], dtype=np.int8), layer=np.array(cols["layer"]),
                 position=np.array(cols["pos"]), feature=np.array(cols["feat"]), activation=np.array(cols["act"]),
                 value=np.array(cols["value"]), constant=np.array(cols["const"]))


def _feature_totals(rows: Rows, targets: list[Target], run: Any, zero: Any) -> list[tuple[float, float]]:
    """Each target feature's (pre-activation, constant): read from the graph run and from the zero run."""
    basis, out = rows.basis, [(0.0, 0.0)] * len(targets)
    by_layer: dict[int, list[int]] = {}
    for i, t in enumerate(targets):
        by_layer.setdefault(t.layer, []).append(i)
    with torch.no_grad():
        for lay, idx in by_layer.items():
            a = basis.active[lay]
            index = torch.tensor([targets[i].index for i in idx], device=a.pos.device)
            v = basis.read(lay, run.targets[lay][0].detach(), a.pos[index], a.ids[index])
            c = basis.read(lay, zero.targets[lay][0], a.pos[index], a.ids[index])
            for j, i in enumerate(idx):
                out[i] = (float(v[j]), float(c[j]))
    return out


__all__ = ["KINDS", "side_graph"]
