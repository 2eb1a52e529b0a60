"""Edge-ablation runs: the reward when only a circuit's edges carry the run and every other edge is corrupted.

Node d (a sublayer's input, or the read-out) reads `x_d + δ_d` with, at the patched columns,
`δ_d = Σ_{u → d ∉ C} (w'_u − w_u)`: `w_u` what upstream part u writes *in this run* (recorded as it
is written), `w'_u` its corrupted write (`patch`'s value through u's own post-norm). So d sees the
current write of its circuit parents and the corrupted write of every other part, the residual
stream unchanged (`_receivers.receiving`). C = every edge gives the clean run; C = ∅ every node
reading the per-part corrupted stream.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import Tensor

from ..model import RewardModel, TraceKey
from ..model.internal import Batch, rewriting
from ._direct import post_normed
from ._engine import Site
from ._receivers import Receiver, read_depth, receiving, sublayer_write, wiring, write_depth


def corrupted_writes(model: RewardModel, ups: list[Site], values: dict[TraceKey, Tensor], n: int, m: int,
                     ) -> dict[str, Tensor]:
    """w'_u [n_targets, m, d]: what each upstream part writes with its corrupted activation."""
    out = {}
    for u in ups:
        v = values[u.key].to(model.device).float()
        v = v.expand(n, m, v.shape[-1]) if v.ndim == 1 else v
        out[u.name] = v if u.kind == "embed" else post_normed(model, u.kind, u.layer, v)
    return out


def _record(store: dict[str, Tensor], name: str, rows: Tensor, cols: Tensor, x: Tensor) -> None:
    store[name] = x[rows, cols].float()


def _fill(buf: Tensor, parents: list[str], cur: dict[str, Tensor], bad: dict[str, Tensor], rows: Tensor,
          cols: Tensor, _x: Tensor) -> None:
    """δ_d at the patched columns, written in place into the buffer `receiving` adds."""
    buf.zero_()
    for u in parents:
        buf[rows, cols] += (bad[u] - cur[u]).to(buf.dtype)


def circuit_rewards(model: RewardModel, batch: Batch, coef: Tensor, cols: Tensor, keep: Tensor,
                    ups: list[Site], bad: dict[str, Tensor]) -> Tensor:
    """Rewards [B] of one batch with only the edges in `keep` [U, D] (D: every sublayer then 'reward')
    carrying the run; `cols` [B, m] the patched columns (padding columns repeat a real one with zero
    change), `bad` the corrupted writes of these rows."""
    b, t = batch.input_ids.shape
    rows = torch.arange(b, device=model.device)[:, None]
    c = cols.to(model.device)
    downs = receivers(model)
    cur: dict[str, Tensor] = {}
    hooks = [(model.layers[0], "in", functools.partial(_record, cur, "embed", rows, c))]
    hooks += [(sublayer_write(model, u.kind, u.layer), "out", functools.partial(_record, cur, u.name, rows, c))
              for u in ups if u.kind != "embed"]
    bufs = {d.name: torch.zeros(b, t, model.d_model, device=model.device) for d in downs}
    for k, d in enumerate(downs):
        parents = [u.name for i, u in enumerate(ups)
                   if write_depth(model, u) <= read_depth(model, d) and not keep[i, k]]
        w = wiring(model, d)
        hooks.append((w.add[0], w.add[1], functools.partial(_fill, bufs[d.name], parents, cur, bad, rows, c)))
    final = model.final_points(batch, gate=False)
    with rewriting(hooks), contextlib.ExitStack() as stack:
        for d in downs:
            stack.enter_context(receiving(model, wiring(model, d), bufs[d.name]))
        got = model.run(batch, final)
    return (model.head_values(model.final_hidden(got[TraceKey.final()]), batch) * coef).sum(-1)


def receivers(model: RewardModel) -> list[Receiver]:
    """The sublayer-level downstream nodes, in `edges`' order: per layer attention, MLP; then 'reward'."""
    out = [Receiver(kind, layer) for layer in range(model.n_layers) for kind in ("attn", "mlp")]
    return [*out, Receiver.reward()]
