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
from ._influence import influence, normalise
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
    (the reward's is `n_columns`)."""
    computed = [rows([Target(-1)])]
    row_cols = [rows.n_columns]
    visited = torch.zeros(rows.n_features, dtype=torch.bool)
    goal = min(cap, rows.n_features)
    pending: list[int] = []
    update_at = 0
    while len(row_cols) - 1 < goal:
        if not pending or len(row_cols) - 1 >= update_at:
            matrix = torch.cat(computed)
            padded = torch.cat([normalise(matrix), matrix.new_zeros(len(matrix), 1)], 1)
            weights = matrix.new_zeros(rows.n_columns + 1)
            weights[-1] = 1.0
            estimate = influence(padded, torch.tensor(row_cols), weights)[: rows.n_features].cpu()
            estimate[visited] = -1.0
            order = estimate.argsort(descending=True)
            pending = [int(c) for c in order[: int((~visited).sum())]]
            update_at = max(2 * (len(row_cols) - 1), batch_size)
        take = pending[: min(batch_size, goal - (len(row_cols) - 1))]
        pending = pending[len(take):]
        computed.append(rows([rows.feature_of(c) for c in take]))
        row_cols += take
        visited[take] = True
    return torch.cat(computed), row_cols


def _assemble(model: RewardModel, batch: Batch, rows: Rows, matrix: Tensor, row_cols: list[int],
              root: tuple[float, float], label: str, run: Any, zero: Any) -> AttributionGraph:
    basis, n_feat = rows.basis, rows.n_features
    chosen = sorted(c for c in row_cols if c < n_feat)
    dropped = torch.ones(n_feat, dtype=torch.bool)
    dropped[chosen] = False
    errors = matrix[:, n_feat: n_feat + rows.n_errors].clone()
    if bool(dropped.any()):  # features past the cap join the error node at their layer and position
        cols = dropped.nonzero().flatten()
        spot = torch.tensor([_error_column(rows, c) for c in cols.tolist()], device=errors.device)
        errors.index_add_(1, spot, matrix[:, cols.to(matrix.device)])
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


def _error_column(rows: Rows, column: int) -> int:
    target = rows.feature_of(column)
    pos = int(rows.basis.active[target.layer].pos[target.index])
    return target.layer * rows.length + pos


def _nodes(model: RewardModel, batch: Batch, rows: Rows, chosen: list[int], errors: bool, root: tuple[float, float],
           run: Any, zero: Any) -> Nodes:
    basis, length = rows.basis, rows.length
    names, kind, layer, pos, feat, act, value, const = [], [], [], [], [], [], [], []
    targets = [rows.feature_of(c) for c in chosen]
    for t in targets:
        a = basis.active[t.layer]
        p, f = int(a.pos[t.index]), int(a.ids[t.index])
        names.append(basis.part(t.layer, f).at(p).name)
        kind.append(0), layer.append(t.layer), pos.append(p), feat.append(f), act.append(float(a.acts[t.index]))
    by_layer: dict[int, list[int]] = {}
    for i, t in enumerate(targets):
        by_layer.setdefault(t.layer, []).append(i)
    value += [0.0] * len(targets)
    const += [0.0] * len(targets)
    with torch.no_grad():
        for lay, idx in by_layer.items():
            a = basis.active[lay]
            index = torch.tensor([targets[i].index for i in idx], device=a.pos.device)
            v = basis.read(lay, run.targets[lay][0].detach(), a.pos[index], a.ids[index])
            c = basis.read(lay, zero.targets[lay][0], a.pos[index], a.ids[index])
            for j, i in enumerate(idx):
                value[i], const[i] = float(v[j]), float(c[j])
    if errors:
        for lay in rows.layers:
            for p in range(length):
                names.append(basis.error_part(lay).at(p).name)
                kind.append(1), layer.append(lay), pos.append(p), feat.append(-1)
        n_err = rows.n_errors
        act += [float("nan")] * n_err
        value += [float("nan")] * n_err
        const += [float("nan")] * n_err
    for p in range(length):
        names.append(Part.embed().at(p).name)
        kind.append(2), layer.append(-1), pos.append(p), feat.append(int(batch.input_ids[0, p]))
    act += [float("nan")] * length
    value += [float("nan")] * length
    const += [float("nan")] * length
    names.append("reward")
    kind.append(3), layer.append(model.n_layers), pos.append(rows.read_at), feat.append(-1)
    act.append(float("nan")), value.append(root[0]), const.append(root[1])
    return Nodes(names=names, kind=np.array(kind, dtype=np.int8), layer=np.array(layer), position=np.array(pos),
                 feature=np.array(feat), activation=np.array(act), value=np.array(value), constant=np.array(const))


__all__ = ["KINDS", "side_graph"]
