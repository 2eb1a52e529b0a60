"""Edge-ablation runs: the reward when only a circuit's edges carry the run and every other edge is corrupted.

Node d (a sublayer's input, a head's query/key/value input, or the read-out) reads `x_d + δ_d` with,
at the patched columns, `δ_d = Σ_{u → d ∉ C} (w'_u − w_u)`: `w_u` what upstream part u writes *in
this run* (recorded as it is written; a head's `z_h W_O[:, h]ᵀ` from the output projection's input),
`w'_u` its corrupted write (`patch`'s value through u's own post-norm; a head's corrupted `z'_h W_O[:, h]ᵀ`).
So d sees the current write of its circuit parents and the corrupted write of every other part, the
residual stream unchanged (`_receivers.receiving_all`, every node in one forward). C = every edge gives
the clean run; C = ∅ every node reading the per-part corrupted stream.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..errors import ArchitectureError
from ..model import RewardModel, TraceKey
from ..model.internal import Batch, rewriting
from ._direct import post_normed
from ._engine import Site, head_write
from ._receivers import Receiver, read_depth, receiving_all, sublayer_write, wiring, write_depth


def check_heads(model: RewardModel) -> None:
    """Head-level edge ablation needs a head's write to be its own term of the stream (no attention
    post-norm: Gemma-2, OLMo-2 renormalise the heads' sum, so one head's change is not additive) and
    a head's own query input (separate projections, no q norm over every head)."""
    if model.arch.attn_post_norm is not None:
        raise ArchitectureError(f"circuit: map {model.arch.name!r} normalises the attention output after the "
                                "heads are summed, so one head's write is not a term of the stream; evaluate "
                                "circuits at level='sublayer'")
    wiring(model, Receiver("head", 0, 0, "q"))  # refuses what no head receiver can have: fused qkv, q/k norms


def corrupted_writes(model: RewardModel, ups: list[Site], values: dict[TraceKey, Tensor], n: int, m: int,
                     ) -> dict[str, Tensor]:
    """w'_u [n_targets, m, d]: what each upstream part writes with its corrupted activation."""
    out = {}
    for u in ups:
        v = values[u.key].to(model.device).float()
        v = v.expand(n, m, v.shape[-1]) if v.ndim == 1 else v
        if u.head is not None:
            out[u.name] = head_write(model, u, v)
        else:
            out[u.name] = v if u.kind == "embed" else post_normed(model, u.kind, u.layer, v)
    return out


def _record(store: dict[str, Tensor], name: str, rows: Tensor, cols: Tensor, x: Tensor) -> None:
    store[name] = x[rows, cols].float()


def _record_heads(model: RewardModel, store: dict[str, Tensor], heads: list[Site], rows: Tensor, cols: Tensor,
                  z: Tensor) -> None:
    for u in heads:
        store[u.name] = head_write(model, u, z[rows, cols])


def _fill(buf: Tensor, parents: list[str], cur: dict[str, Tensor], bad: dict[str, Tensor], rows: Tensor,
          cols: Tensor, _x: Tensor) -> None:
    """δ_d at the patched columns, written in place into the buffer the node reads (before it runs)."""
    buf.zero_()
    for u in parents:
        buf[rows, cols] += (bad[u] - cur[u]).to(buf.dtype)


def circuit_rewards(model: RewardModel, batch: Batch, coef: Tensor, cols: Tensor, keep: Tensor,
                    ups: list[Site], downs: list[Receiver], bad: dict[str, Tensor]) -> Tensor:
    """Rewards [B] of one batch with only the edges in `keep` [U, D] carrying the run; `cols` [B, m] the
    patched columns (padding columns repeat a real one with zero change), `bad` the corrupted writes of
    these rows. One forward: every node's δ is filled just before the node reads it."""
    b, t = batch.input_ids.shape
    rows = torch.arange(b, device=model.device)[:, None]
    c = cols.to(model.device)
    cur: dict[str, Tensor] = {}
    hooks = [(model.layers[0], "in", functools.partial(_record, cur, "embed", rows, c))]
    hooks += [(sublayer_write(model, u.kind, u.layer), "out", functools.partial(_record, cur, u.name, rows, c))
              for u in ups if u.kind != "embed" and u.head is None]
    for layer in sorted({u.layer for u in ups if u.head is not None}):
        heads = [u for u in ups if u.head is not None and u.layer == layer]
        hooks.append((model.layer_module(layer, model.arch.attn_out), "in",
                      functools.partial(_record_heads, model, cur, heads, rows, c)))
    bufs = {d: torch.zeros(b, t, model.d_model, device=model.device) for d in downs}
    for k, d in enumerate(downs):
        parents = [u.name for i, u in enumerate(ups)
                   if write_depth(model, u) <= read_depth(model, d) and not keep[i, k]]
        at = (model.layers[d.layer], "in") if d.kind == "head" else wiring(model, d).add
        hooks.append((at[0], at[1], functools.partial(_fill, bufs[d], parents, cur, bad, rows, c)))
    final = model.final_points(batch, gate=False)
    with rewriting(hooks), receiving_all(model, bufs):  # registered after the fills: they run first
        got = model.run(batch, final)
    return (model.head_values(model.final_hidden(got[TraceKey.final()]), batch) * coef).sum(-1)

