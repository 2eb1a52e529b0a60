"""Read-position patching that starts each patched copy at its own layer, on the prefix's cache.

The copy engine (`patch_engine.read_sweep`) runs every copy of the read token through every
layer and recomputes the prefix with them. Here one clean forward of each target keeps its keys
and values (the model's own cache) and the read token's input to every layer; the copies that
patch layer l then start at layer l from that input, attend to the cached prefix, and run the
model's own layers l..L-1 with the arguments the model itself builds for such a continuation
(`model/_continuing.py: continuation_args`). Each group also carries two
unpatched copies that must reproduce the clean read token's final state exactly: that proves the
cache, positions and masks on this model before any number is used; otherwise the caller falls
back to the copy engine.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..data import part
from ..model import RewardModel, TraceKey
from ..model.internal import (
    OOM_ERRORS,
    Batch,
    Point,
    Tokenized,
    additive_mask,
    cache_name,
    cached_forward,
    capture,
    collate,
    continuation_args,
    each_batch,
    eval_mode,
    first_output,
    fork_cache,
)
from ._engine import Declined, Overwrite, Site, head_slice, patched, take_values


def cached_read_sweep(
    model: RewardModel,
    seqs: list[Tokenized],
    read: list[int],
    sweep: list[Site],
    values: dict[TraceKey, Tensor],
    coef: Tensor,
    *,
    batch_size: int = 8,
    min_copies: int = 32,
    index: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor] | None:
    """Clean rewards [n] and patched rewards [n, S], as `patch_engine.read_sweep`; None when this
    model's cache cannot be used this way (the proof copies disagree, or a call fails).

    Consecutive layers are pooled until a group holds `min_copies` copies, which then start at the
    group's first layer: fewer, larger layer calls (per-call overhead dominates small models)
    for a little recomputation below the later sites' layers. `index`: each sequence's number in the
    caller's input (for `OutOfMemoryError`)."""
    name = cache_name(model)
    if name is None or model.encoder:
        return None
    n = len(seqs)
    clean, rewards = torch.zeros(n, device=model.device), torch.zeros(n, len(sweep), device=model.device)
    groups = _groups(sweep, min_copies)
    dtype = next(model.model.parameters()).dtype

    def work(batch_rows: list[int]) -> None:
        rows = torch.tensor(batch_rows)
        batch = collate([seqs[i] for i in rows], pad_id=model.pad_token_id, side="right", first=False,
                        device=model.device)
        at = torch.tensor([read[i] for i in rows], device=model.device)
        # Each layer's input (keyed by the layer: what a copy starting there reads) and the final residual.
        points: dict[int | TraceKey, Point] = {layer: Point(model.layers[layer], "in", at)
                                               for layer in range(model.n_layers)}
        points[TraceKey.final()] = model.final_point(at)
        try:
            with capture(points, model.device) as captured:
                cache = cached_forward(model, batch)
        except OOM_ERRORS:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:
            raise Declined from exc
        if cache is None:
            raise Declined
        final = captured[TraceKey.final()]
        clean[rows] = (model.head(model.final_hidden(final)) * coef[rows]).sum(-1)
        width = batch.input_ids.shape[1]
        for done, (first_layer, group) in enumerate(sorted(groups.items())):
            part(done, len(groups))
            got = _group(model, batch, at, width, cache, name, captured, first_layer, [sweep[s] for s in group],
                         values, rows, coef[rows], dtype)
            if got is None:
                raise Declined
            proof, patched_rewards = got
            tol = 1e-4 * float(final.abs().max())
            if not math.isfinite(tol):  # a non-finite clean run proves nothing: the full engine says it in NaN
                raise Declined
            if not torch.allclose(proof, final[:, None].expand_as(proof), rtol=1e-3, atol=tol):
                raise Declined
            rewards[rows[:, None], torch.tensor(group)[None]] = patched_rewards

    try:
        each_batch(sorted(range(n), key=lambda i: read[i]), batch_size, work, ids=index, is_pairs=True)
    except Declined:
        return None
    return clean, rewards


def _groups(sweep: list[Site], min_copies: int) -> dict[int, list[int]]:
    """Site indices by the layer their copies start at, consecutive layers pooled to `min_copies`."""
    by_layer: dict[int, list[int]] = defaultdict(list)
    for s, site in enumerate(sweep):
        by_layer[0 if site.kind == "embed" else site.layer].append(s)
    groups: dict[int, list[int]] = {}
    start = 0  # set from the first layer of each group below
    pending: list[int] = []
    for layer in sorted(by_layer):
        start = layer if not pending else start
        pending += by_layer[layer]
        if len(pending) >= min_copies:
            groups[start], pending = pending, []
    if pending:
        groups[start] = pending
    return groups


def _group(
    model: RewardModel, batch: Batch, at: Tensor, width: int, cache: Any, name: str,
    captured: dict[int | TraceKey, Tensor], first_layer: int,
    group: list[Site], values: dict[TraceKey, Tensor], rows: Tensor, coef: Tensor, dtype: torch.dtype,
) -> tuple[Tensor, Tensor] | None:
    """Run the copies of one starting layer: (the two proof copies' final residuals [B, 2, d], the
    group's patched rewards [B, G])."""
    b, copies = len(rows), len(group) + 2
    device = model.device
    ids = batch.input_ids[torch.arange(b, device=device), at][:, None].expand(b, copies)
    j = torch.arange(width + copies, device=device)[None, None, :]
    i = torch.arange(copies, device=device)[None, :, None]
    allow = (j < at[:, None, None]) | (j == width + i)  # the prefix (not the clean read token, not pads) and itself
    fork = fork_cache(cache)
    kwargs = {"input_ids": ids, "attention_mask": additive_mask(allow, dtype),
              "position_ids": at[:, None].expand(b, copies), name: fork, "use_cache": True}
    try:
        args, layer_kwargs = continuation_args(model, model.forward_kwargs(**kwargs))
        hidden = captured[first_layer][:, None].expand(b, copies, -1).to(dtype).contiguous()
        edits = [Overwrite(site, torch.arange(b), torch.full((b, 1), 1 + k), take_values(values[site.key], rows,
                      head_slice(model, site), read=True)) for k, site in enumerate(group)]
        with torch.no_grad(), eval_mode(model.model), patched(model, edits):
            for layer in range(first_layer, model.n_layers):
                hidden = first_output(model.layers[layer](hidden, *args, **layer_kwargs))
    except OOM_ERRORS:
        raise
    except (RuntimeError, ValueError, TypeError, KeyError):
        return None
    final = hidden.float().to(model.device)  # the head may sit on a later device than the last layer
    objectives = model.head(model.final_hidden(final[:, 1:-1].flatten(0, 1))).view(b, len(group), -1)
    return final[:, [0, -1]], (objectives * coef[:, None]).sum(-1)

