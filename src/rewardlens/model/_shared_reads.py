"""The read loop on sequences that share a prefix: the prefix read once, each sequence's rest continuing it.

A probe item's variants share its prompt (and often the start of its response); the concept sets'
with/without conversations share theirs. In a causal decoder everything a sequence computes before the
first token where it leaves its family's shared prefix is what the prefix alone computes, so a family
is read as one forward of the prefix (keeping the model's cache) and, per member, a continuation of
its remaining tokens on that cache (`model/_continuing.py`), captured at the member's read token as
the plain loop captures it. Each chunk of families first proves the continuation: the last prefix
token, continued on the cache of the tokens before it, must reproduce what the prefix's own forward
captured there at every depth read. Where it does not (or the model cannot continue a cache), every
sequence goes to the plain loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._continuing import (
    agrees,
    cache_name,
    cache_rows,
    cached_forward,
    continuable,
    continuation_mask,
    packed,
    proof_tol,
)
from ._hooks import Point, capture, eval_mode
from ._keys import TraceKey
from ._oom import OOM_ERRORS
from ._reading import Reading, Sink, read_loop
from ._tokens import Tokenized, collate

if TYPE_CHECKING:
    from ._core import RewardModel

MIN_SHARED = 16
"""Tokens a family's prefix holds at least: a shorter one saves less than a continuation costs."""


def read_sharing(model: RewardModel, seqs: list[Tokenized], *, layers: Sequence[str], batch_size: int,
                 readout: bool, step: Callable[[int], object] | None = None) -> Reading:
    """`RewardModel.read(seqs, layers=, batch_size=, readout=)`, the same numbers to float precision, with the
    sequences that share a prefix read as one prefix and its continuations (`read_shared`); `step(n)` as
    each `n` sequences are read (`Sink`)."""
    sink = Sink(model, len(seqs), layers=layers, gate=True, readout=readout, step=step)
    rest = read_shared(model, seqs, sink, batch_size=batch_size)
    read_loop(model, [seqs[i] for i in rest], sink, batch_size=batch_size, index=rest)
    return sink.reading()


def read_shared(model: RewardModel, seqs: list[Tokenized], sink: Sink, *, batch_size: int) -> list[int]:
    """Read the sequences of `seqs` that share a prefix with another into `sink` (rows as in `seqs`); the
    indices left for the plain loop: the rest, and every family of a chunk whose proof failed and of the
    chunks after it (all of them where the model cannot continue a cache)."""
    everyone = list(range(len(seqs)))
    if len(seqs) < 2 or model.gated or not continuable(model, seqs):
        return everyone
    reads = collate(seqs, pad_id=model.pad_token_id, side="right", first=False,
                    device=torch.device("cpu")).read_index.tolist()
    # By prefix length, so a chunk's prefixes pad (and its continuations attend over) little.
    shared = sorted((f for f in families(seqs, reads) if len(f[1]) > 1), key=lambda f: f[0])
    done: set[int] = set()
    for at in range(0, len(shared), batch_size):
        chunk = shared[at : at + batch_size]
        try:
            proven = _chunk(model, seqs, reads, chunk, sink, batch_size)
        except OOM_ERRORS:
            proven = False  # the plain loop backs off batch by batch
        if not proven:  # rows it filled are filled again by the plain loop
            break
        done.update(i for _, members in chunk for i in members)
    return [i for i in everyone if i not in done]


def families(seqs: Sequence[Tokenized], reads: Sequence[int]) -> list[tuple[int, list[int]]]:
    """Sequences grouped by a shared prefix: (its length p, member indices), p at most every member's read
    position (its read token lies in what it continues), every sequence in one group. Sequences are taken
    in the order of their ids, so a prompt's variants are neighbours, and the run is split where doing so
    saves more prefix tokens, (members − 1) · p summed over groups, than keeping it whole; a prefix under
    `MIN_SHARED` tokens saves nothing (a continuation's call costs more)."""
    order = sorted(range(len(seqs)), key=lambda k: seqs[k].ids)
    links = [min(_common(seqs[a].ids, seqs[b].ids, min(reads[a], reads[b])), reads[a], reads[b])
             for a, b in zip(order, order[1:])]
    return _best(order, links, reads)[1]


def _best(order: list[int], links: list[int], reads: Sequence[int], depth: int = 0
          ) -> tuple[int, list[tuple[int, list[int]]]]:
    """(prefix tokens saved, groups) of the best split of a run of sorted sequences, `links[k]` the prefix
    `order[k]` shares with `order[k + 1]`: the run whole (its prefix: the smallest link), or split at its
    smallest links with each piece split the best way in turn."""
    if len(order) == 1:
        return 0, [(reads[order[0]], order)]
    low = min(links)
    whole = (len(order) - 1) * low if low >= MIN_SHARED else 0
    if low >= MIN_SHARED and (depth > 64 or low == max(links)):  # nothing to gain by splitting further
        return whole, [(low, order)]
    cuts = [k + 1 for k, link in enumerate(links) if link == low]
    saved, groups = 0, list[tuple[int, list[int]]]()
    for lo, hi in zip([0, *cuts], [*cuts, len(order)]):
        got = _best(order[lo:hi], links[lo : hi - 1], reads, depth + 1)
        saved, groups = saved + got[0], groups + got[1]
    return (whole, [(low, order)]) if low >= MIN_SHARED and whole >= saved else (saved, groups)


def _common(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens `a` and `b` share, at most `limit`."""
    n = min(limit, len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def _chunk(model: RewardModel, seqs: list[Tokenized], reads: list[int], chunk: list[tuple[int, list[int]]],
           sink: Sink, batch_size: int) -> bool:
    """One chunk of families into `sink`: their prefixes' forward, the proof, then every member's
    continuation; False when the proof (or a call) fails."""
    device = model.device
    prefixes = collate([Tokenized(seqs[members[0]].ids[:p]) for p, members in chunk], pad_id=model.pad_token_id,
                       side="right", first=False, device=device)
    last = torch.tensor([p - 1 for p, _ in chunk])
    with capture(_points(model, sink, last.to(device)), device) as want:
        cache = cached_forward(model, prefixes)
    if cache is None:
        return False
    width = prefixes.input_ids.shape[1]
    # The proof: each prefix's last token continued on its own cache gives what its forward captured there;
    # rows reversed and twice over, so a cache row matched to the wrong continuation shows.
    rows = torch.arange(len(chunk) - 1, -1, -1).repeat(2)
    proof = _continue(model, sink, cache, width, rows, last[rows], [[seqs[chunk[f][1][0]].ids[chunk[f][0] - 1]]
                                                                    for f in rows.tolist()],
                      torch.zeros(len(rows), dtype=torch.long))
    tol = proof_tol(model)  # not None: read_shared asked `continuable`
    if proof is None or tol is None or not all(agrees(proof[k], want[k][rows.to(want[k].device)], tol) for k in want):
        return False
    members = [(f, i) for f, (_, group) in enumerate(chunk) for i in group]
    members.sort(key=lambda fi: len(seqs[fi[1]].ids) - chunk[fi[0]][0])
    budget = batch_size * max(len(seqs[i].ids) for _, i in members)  # positions a call holds: a batch's worth
    for batch in packed(members, [len(seqs[i].ids) - chunk[f][0] for f, i in members], budget):
        fam = torch.tensor([f for f, _ in batch])
        start = torch.tensor([chunk[f][0] for f, _ in batch])
        rest = [seqs[i].ids[chunk[f][0]:] for f, i in batch]
        got = _continue(model, sink, cache, width, fam, start, rest, torch.tensor([reads[i] for _, i in batch]) - start)
        if got is None:
            return False
        sink.fill(torch.tensor([i for _, i in batch], device=device), got)
    return True


def _points(model: RewardModel, sink: Sink, cols: Tensor) -> dict[TraceKey, Point]:
    """What the read loop captures (the head's residual and the asked depths) at `cols` [n]."""
    return {TraceKey.final(): model.final_point(cols), **sink.depths(cols)}


def _continue(model: RewardModel, sink: Sink, cache: Any, width: int, fam: Tensor, start: Tensor,
              rest: list[list[int]], read: Tensor) -> dict[TraceKey, Tensor] | None:
    """Rows continuing family prefixes: row r runs tokens `rest[r]` from position `start[r]` on the cache
    row `fam[r]` (which holds `width` positions, the first `start[r]` of them its prefix), captured at
    position `read[r]` of its own tokens. None when the model refuses the call."""
    device, span = model.device, max(len(r) for r in rest)
    pad = model.pad_token_id if model.pad_token_id is not None else 0
    ids = torch.tensor([r + [pad] * (span - len(r)) for r in rest], device=device)
    steps = torch.arange(span)[None]
    positions = (start[:, None] + torch.minimum(steps, torch.tensor([len(r) - 1 for r in rest])[:, None])).to(device)
    mask = continuation_mask(start.to(device), width, span, next(model.model.parameters()).dtype)
    name = cache_name(model)
    assert name is not None  # read_shared checked it
    kwargs = model.forward_kwargs(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                  **{name: cache_rows(cache, fam)})
    try:
        with torch.no_grad(), eval_mode(model.model), capture(_points(model, sink, read.to(device)), device) as got:
            model.backbone(**kwargs)
    except OOM_ERRORS:
        raise
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return dict(got)


__all__ = ["MIN_SHARED", "families", "read_shared", "read_sharing"]
