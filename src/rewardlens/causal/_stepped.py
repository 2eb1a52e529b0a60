"""Whole-sequence patching that starts each patched run at its own layer.

The recording and the stepping themselves (`Recording`, `stepping_works`, `stepped_readout`) are the
model layer's (`model/_stepping.py`); this module is the patching sweep on top of them: parts grouped by
their first layer, rows of many (target, part) runs batched, each run from its patched layer on. A
model whose layers cannot be stepped declines, and the caller runs full forwards.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor

from ..data.internal import part
from ..model import RewardModel, TraceKey
from ..model.internal import Recording, Tokenized, collate, each_batch, stepped_readout, stepping_works, unambiguous
from ._engine import Declined, Overwrite, Site, head_slice, patched, take_values


def stepped_sweep(
    model: RewardModel,
    seqs: list[Tokenized],
    sweep: list[Site],
    cols: Tensor,
    values: dict[TraceKey, Tensor],
    *,
    batch_size: int = 8,
    labels: list[str] | None = None,
    index: Sequence[int] | None = None,
) -> Tensor | None:
    """Patched rewards [n, S], as `patch_engine.batched_sweep`, each run starting at its patched
    layer. None when this model's layers cannot be stepped (the caller runs full forwards).
    `index`: each sequence's number in the caller's input (for `OutOfMemoryError`)."""
    rewards = torch.zeros(len(seqs), len(sweep), device=model.device)
    by_start: dict[int, list[int]] = defaultdict(list)
    for s, site in enumerate(sweep):
        by_start[0 if site.kind == "embed" else site.layer].append(s)
    size = batch_size  # of the patched runs' batches: the clean batch's, shrunk with it on out-of-memory

    def work(rows: list[int]) -> None:
        nonlocal size
        size = min(size, len(rows))
        for group in unambiguous(seqs, rows):
            step(group, size)

    def step(index: list[int], size: int) -> None:
        batch = collate([seqs[i] for i in index], pad_id=model.pad_token_id, side="right", first=model.encoder,
                        device=model.device, labels=[labels[i] for i in index] if labels else None)
        rec = Recording(model, batch)
        if not stepping_works(model, rec):
            raise Declined
        for done, (start, group) in enumerate(sorted(by_start.items())):
            part(done, len(by_start))
            jobs = [(b, s) for s in group for b in range(len(index))]
            for at in range(0, len(jobs), size):
                job = jobs[at : at + size]
                rows = torch.tensor([b for b, _ in job])
                seq = torch.tensor([index[b] for b, _ in job])
                by_site: dict[int, list[int]] = defaultdict(list)
                for r, (_, s) in enumerate(job):
                    by_site[s].append(r)
                edits = [Overwrite(sweep[s], torch.tensor(rs), cols[seq[rs]],
                              take_values(values[sweep[s].key], seq[rs], head_slice(model, sweep[s])))
                         for s, rs in by_site.items()]
                with patched(model, edits):
                    hidden = rec.run(model, start, rows)
                rewards[seq, [s for _, s in job]] = stepped_readout(model, rec, hidden, rows)

    try:
        each_batch(sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids)), batch_size, work, ids=index,
                   is_pairs=True, lengths=[len(s.ids) for s in seqs])  # a short target is not padded to a long one
    except Declined:
        return None
    return rewards
