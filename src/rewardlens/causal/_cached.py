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

For divergence each copy's residual after every layer it runs is its stream; below its group's first
layer a copy is the clean read token, so the clean residuals captured there complete it (divergence
scores only the patched layer and later ones).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..data.internal import part
from ..model import RewardModel, TraceKey
from ..model.internal import (
    OOM_ERRORS,
    Batch,
    Point,
    Recording,
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
    reproduces,
)
from ._engine import Declined, Overwrite, Site, head_slice, patched, resid_points, take_values
from ._layerwise import Recorded


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
    resid: Callable[[Tensor], Tensor] | None = None,
    held: Recorded | None = None,
    states: dict[TraceKey, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor | None] | None:
    """Clean rewards [n], patched rewards [n, S] and, with `resid`, `resid(x)` of each patched copy's
    residual after every layer x [n, S, L, d] (else None), as `patch_engine.read_sweep`; None when this
    model's cache cannot be used this way (the proof copies disagree, or a call fails).

    Consecutive layers are pooled until a group holds `min_copies` copies, which then start at the
    group's first layer: fewer, larger layer calls (per-call overhead dominates small models)
    for a little recomputation below the later sites' layers. `index`: each sequence's number in the
    caller's input (for `OutOfMemoryError`, and the key of `held`).

    `held`: the caches the caller's traced forward kept of these sequences (`trace_pairs(record=)`), with
    `states` its read-token captures (rows: the caller's sequences; `embed`, every `resid`, `final`): the
    sequences they hold start from them, with no clean forward here, each group proving itself as below;
    the rest (and any group whose proof fails) run their own."""
    name = cache_name(model)
    if name is None or model.encoder:
        return None
    n = len(seqs)
    clean, rewards = torch.zeros(n, device=model.device), torch.zeros(n, len(sweep), device=model.device)
    streams = torch.zeros(n, len(sweep), model.n_layers, device=model.device) if resid else None
    groups = _groups(sweep, min_copies)
    dtype = next(model.model.parameters()).dtype
    caller = list(range(n)) if index is None else list(index)

    def run(rows: Tensor, batch: Batch, at: Tensor, cache: Any, captured: dict[int | TraceKey, Tensor]) -> None:
        """Every group's copies of batch rows `rows` [B] (into `seqs`), from their clean cache and captures."""
        final = captured[TraceKey.final()]
        if not math.isfinite(float(final.abs().max())):  # a non-finite clean run proves nothing: the full
            raise Declined  # engine says it in NaN
        clean[rows] = (model.head(model.final_hidden(final)) * coef[rows]).sum(-1)
        width = batch.input_ids.shape[1]
        for done, (first_layer, group) in enumerate(sorted(groups.items())):
            part(done, len(groups))
            got = _group(model, batch, at, width, cache, name, captured, first_layer, [sweep[s] for s in group],
                         values, rows, coef[rows], dtype, resid is not None)
            if got is None or not reproduces(model, got[0], final[:, None].expand_as(got[0])):
                raise Declined
            rewards[rows[:, None], torch.tensor(group)[None]] = got[1]
            if resid and streams is not None:
                below = [captured[TraceKey.resid(layer)][:, None].expand(len(rows), len(group), -1)
                         for layer in range(first_layer)]
                streams[rows[:, None], torch.tensor(group)[None]] = resid(torch.stack([*below, *got[2]], dim=2))

    def work(batch_rows: list[int]) -> None:
        rows = torch.tensor(batch_rows)
        batch = collate([seqs[i] for i in rows], pad_id=model.pad_token_id, side="right", first=False,
                        device=model.device)
        at = torch.tensor([read[i] for i in rows], device=model.device)
        # Each layer's input (keyed by the layer: what a copy starting there reads) and the final residual.
        points: dict[int | TraceKey, Point] = {layer: Point(model.layers[layer], "in", at)
                                               for layer in range(model.n_layers)}
        points[TraceKey.final()] = model.final_point(at)
        if resid:  # the clean residuals below a group's first layer
            points.update(resid_points(model, at).items())
        try:
            with capture(points, model.device) as captured:
                cache = cached_forward(model, batch)
        except OOM_ERRORS:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:
            raise Declined from exc
        if cache is None:
            raise Declined
        run(rows, batch, at, cache, captured)

    done = _from_held(model, held, states, caller, read, run)
    try:
        each_batch(sorted((i for i in range(n) if i not in done), key=lambda i: len(seqs[i].ids)), batch_size, work,
                   ids=index, is_pairs=True, lengths=[len(s.ids) for s in seqs])  # a short target is not padded
    except Declined:
        return None
    return clean, rewards, streams


_Run = Callable[[Tensor, Batch, Tensor, Any, dict[int | TraceKey, Tensor]], None]
"""`run(rows, batch, at, cache, captured)`: every group's copies of some rows, from their clean state."""


def _from_held(model: RewardModel, held: Recorded | None, states: dict[TraceKey, Tensor] | None,
               caller: list[int], read: list[int], run: _Run) -> set[int]:
    """Run (`run(rows, batch, at, cache, captured)`) the sequences whose clean cache `held` keeps, from it and
    the read-token `states`: layer l's input is the residual after layer l - 1 (the embeddings for layer 0),
    which the group's proof checks with the rest. `held` is emptied, each cache let go of once its rows ran.
    The rows (into `caller`) done; a group the proof refuses, or that does not fit, is left to the caller."""
    done: set[int] = set()
    if held is None or states is None:
        return done
    keys: dict[int | TraceKey, TraceKey] = {0: TraceKey.embed(), TraceKey.final(): TraceKey.final()}
    keys.update({layer: TraceKey.resid(layer - 1) for layer in range(1, model.n_layers)})
    keys.update({TraceKey.resid(layer): TraceKey.resid(layer) for layer in range(model.n_layers)})
    for js, rec in held.drain(caller):
        if _held_group(model, js, rec, states, keys, caller, read, run):
            done.update(js)
        del rec  # let go of this cache before the next is handed over
    return done


def _held_group(model: RewardModel, js: list[int], rec: Recording, states: dict[TraceKey, Tensor],
                keys: dict[int | TraceKey, TraceKey], caller: list[int], read: list[int], run: _Run) -> bool:
    """Rows `js` (into `caller`) from their held recording `rec`; False when it holds no cache, reads them
    elsewhere, fails its proof or does not fit (their own forward then runs them)."""
    at = rec.batch.read_index.to(model.device)
    if rec.cache is None or at.tolist() != [read[j] for j in js]:
        return False
    pick = torch.tensor([caller[j] for j in js], device=model.device)
    captured = {k: states[key][pick.to(states[key].device)].to(model.device) for k, key in keys.items()}
    try:
        run(torch.tensor(js), rec.batch, at, rec.cache, captured)
    except Declined:
        return False
    except OOM_ERRORS:
        return False  # their own forward runs them, with the out-of-memory back-off
    return True


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
    streams: bool,
) -> tuple[Tensor, Tensor, list[Tensor]] | None:
    """Run the copies of one starting layer: (the two proof copies' final residuals [B, 2, d], the
    group's patched rewards [B, G], with `streams` the patched copies' residual after each layer it ran,
    fp32 [B, G, d] from `first_layer` on (else an empty list))."""
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
            stream: list[Tensor] = []
            for layer in range(first_layer, model.n_layers):
                hidden = first_output(model.layers[layer](hidden, *args, **layer_kwargs))
                if streams:  # only for divergence: L such copies would otherwise be held for nothing
                    stream.append(hidden[:, 1:-1].float().to(device))
    except OOM_ERRORS:
        raise
    except (RuntimeError, ValueError, TypeError, KeyError):
        return None
    final = hidden.float().to(model.device)  # the head may sit on a later device than the last layer
    objectives = model.head(model.final_hidden(final[:, 1:-1].flatten(0, 1))).view(b, len(group), -1)
    return final[:, [0, -1]], (objectives * coef[:, None]).sum(-1), stream

