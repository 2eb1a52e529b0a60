"""Whole-sequence patching of causal decoders that computes only the positions a patch can change.

In a causal decoder the activations at position t depend on tokens 0..t alone. Where a target and
its source share their first c tokens (a pair's two sides share the prompt and the chat template),
the source's activations there equal the target's, so a prefix or whole-sequence patch changes
nothing before the first position q whose inserted value can differ (`PatchPlan.unchanged`), and
nothing before q moves in any layer. Each patched run of part p (first layer l) then starts at
layer l from the clean run's recorded input at positions q..T-1 only, attends to the clean run's
own keys and values for 0..q-1 (the model's cache, every layer), and calls the model's own layers
l..L-1 with the arguments the model builds for such a continuation (`continuation_args`). The cost
of a run falls from (L - l) layers over T tokens to (L - l) layers over T - q. Each batch of
targets first proves, with unpatched continuations from layer 0 (rows reversed and twice over),
that the continuation reproduces the clean run at every computed position; otherwise the caller
falls back to the stepped engine (docs/design.md §5).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..data.internal import part
from ..model import RewardModel, TraceKey
from ..model.internal import (
    OOM_ERRORS,
    Batch,
    LayerTaps,
    Tokenized,
    agrees,
    cache_name,
    cache_rows,
    cached_forward,
    collate,
    continuable,
    continuation_args,
    continuation_mask,
    each_batch,
    eval_mode,
    first_output,
    packed,
    proof_tol,
)
from ._engine import Declined, Overwrite, Site, head_slice, patched, take_values


def suffix_sweep(
    model: RewardModel,
    seqs: list[Tokenized],
    sweep: list[Site],
    cols: Tensor,
    values: dict[TraceKey, Tensor],
    unchanged: Sequence[int],
    *,
    batch_size: int = 8,
    min_tokens: int = 256,
    labels: list[str] | None = None,
    index: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor] | None:
    """Clean rewards [n] and patched rewards [n, S], as `patch_engine.batched_sweep` with columns `cols`
    [n, m] and `values`, each run computing only positions `unchanged[i]`..T-1 of target i (the edits at
    earlier columns insert what is there already). None when the model is not a plain causal decoder
    read at one token, or its cache cannot be continued this way (the caller runs the stepped engine).
    `min_tokens`: consecutive start layers are pooled until a group computes this many positions a layer
    (`_pooled`)."""
    if not any(unchanged) or not suffix_possible(model, seqs):
        return None
    name = cache_name(model)
    assert name is not None  # suffix_possible checked it
    rewards = torch.zeros(len(seqs), len(sweep), device=model.device)
    clean_rewards = torch.zeros(len(seqs), device=model.device)
    by_start: dict[int, list[int]] = defaultdict(list)
    for s, site in enumerate(sweep):
        by_start[0 if site.kind == "embed" else site.layer].append(s)

    def work(rows: list[int]) -> None:
        batch = collate([seqs[i] for i in rows], pad_id=model.pad_token_id, side="right", first=False,
                        device=model.device, labels=[labels[i] for i in rows] if labels else None)
        clean = _Clean.trace(model, batch, name, [min(unchanged[i], len(seqs[i].ids) - 1) for i in rows])
        if not clean.proves(model):
            raise Declined
        clean_rewards[torch.tensor(rows)] = clean.rewards(model, clean.top, clean.read, torch.arange(len(rows)))
        kept = _kept_columns(cols[rows], clean.start)
        spans = (clean.length - clean.start).tolist()
        order = sorted(range(len(rows)), key=spans.__getitem__)
        groups = _pooled(by_start, sum(spans), min_tokens)
        budget = len(rows) * batch.input_ids.shape[1]  # positions a call holds: this clean batch's worth

        def run(start: int, job: list[tuple[int, int]]) -> None:
            tb = torch.tensor([b for b, _ in job])
            try:
                hidden = clean.run(model, start, tb, _edits(model, sweep, job, rows, kept, values))
            except OOM_ERRORS:
                if len(job) == 1:
                    raise  # the batch loop backs off with fewer targets
                run(start, job[: len(job) // 2])
                run(start, job[len(job) // 2 :])
                return
            at = clean.read[tb] - clean.start[tb]
            rewards[torch.tensor(rows)[tb], [s for _, s in job]] = clean.rewards(model, hidden, at, tb)

        for done, (start, group) in enumerate(groups):
            part(done, len(groups))
            jobs = [(b, s) for b in order for s in group]
            for job in packed(jobs, [spans[b] for b, _ in jobs], budget):
                run(start, job)

    try:
        each_batch(sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids)), batch_size, work, ids=index,
                   is_pairs=True, lengths=[len(s.ids) for s in seqs])  # a short target is not padded to a long one
    except Declined:
        return None
    return clean_rewards, rewards


def suffix_possible(model: RewardModel, seqs: list[Tokenized]) -> bool:
    """Whether `suffix_sweep` may run on this model (it still proves itself on every batch): a causal
    decoder with a cache, one read token and no gate, whose tokens can be given their own positions, at a
    dtype whose proof can tell a bug from rounding (`proof_tol`)."""
    return not model.gated and not model.reads.multi and continuable(model, seqs)


def _pooled(by_start: dict[int, list[int]], per_site: int, min_tokens: int) -> list[tuple[int, list[int]]]:
    """Sites by the layer their runs start at, consecutive layers pooled until a group computes at least
    `min_tokens` positions a layer (`per_site` positions per site); a group's runs start at its first
    layer, recomputing a few clean layers for fewer, larger layer calls (per-call overhead dominates
    short suffixes). Exact either way: a layer below a run's patch computes its clean output."""
    groups: list[tuple[int, list[int]]] = []
    pending: list[int] = []
    start = 0
    for layer in sorted(by_start):
        start = layer if not pending else start
        pending += by_start[layer]
        if len(pending) * per_site >= min_tokens:
            groups.append((start, pending))
            pending = []
    if pending:
        groups.append((start, pending))
    return groups


def _kept_columns(cols: Tensor, start: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Which of each row's columns [B, m] lie at or after its start [B]: indices into them [B, m'] (a row's
    last kept index repeated to pad it), those columns counted from the start [B, m'], and whether the row
    keeps any [B] (one that keeps none is patched nowhere it computes: its run is the clean one)."""
    keep = cols >= start[:, None]
    width = max(int(keep.sum(1).max()), 1)
    picked = torch.zeros(len(cols), width, dtype=torch.long)
    for b in range(len(cols)):
        at = torch.nonzero(keep[b])[:, 0]
        if len(at):
            picked[b] = torch.cat([at, at[-1:].expand(width - len(at))])
    shifted = (cols.gather(1, picked) - start[:, None]).clamp_min(0)
    return picked, shifted, keep.any(1)


def _edits(
    model: RewardModel, sweep: list[Site], job: list[tuple[int, int]], rows: list[int],
    kept: tuple[Tensor, Tensor, Tensor], values: dict[TraceKey, Tensor],
) -> list[Overwrite]:
    """One `Overwrite` per site of `job` ((batch row, site) pairs), at its rows' kept columns (`_kept_columns`)."""
    picked, shifted, has = kept
    by_site: dict[int, list[int]] = defaultdict(list)
    for r, (b, s) in enumerate(job):
        if has[b]:
            by_site[s].append(r)
    edits = []
    for s, rs in by_site.items():
        tb = torch.tensor([job[r][0] for r in rs])
        seq = torch.tensor(rows)[tb]
        taken = take_values(values[sweep[s].key], seq, head_slice(model, sweep[s]))
        if taken.ndim == 3:  # per position: the kept columns' values
            taken = taken.gather(1, picked[tb].to(taken.device)[..., None].expand(-1, -1, taken.shape[-1]))
        edits.append(Overwrite(sweep[s], torch.tensor(rs), shifted[tb], taken))
    return edits


class _Clean:
    """One batch of targets' clean run: every layer's input [B, T, d], the last layer's output, the model's
    cache of keys and values, and where each row's computed suffix starts [B]."""

    def __init__(self, batch: Batch, inputs: list[Tensor], top: Tensor, cache: Any, name: str, start: Tensor) -> None:
        self.batch, self.inputs, self.top, self.cache, self.name, self.start = batch, inputs, top, cache, name, start
        self.length = batch.attention_mask.sum(1).cpu()
        self.read = batch.read_index.cpu()

    @classmethod
    def trace(cls, model: RewardModel, batch: Batch, name: str, start: list[int]) -> _Clean:
        """The clean forward of `batch` with its cache kept; `start` [B]: each row's first computed position
        (at most its read token)."""
        try:
            with LayerTaps(model) as taps:
                cache = cached_forward(model, batch)
        except OOM_ERRORS:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:
            raise Declined from exc
        if cache is None or taps.top is None:
            raise Declined
        first = torch.tensor(start)
        return cls(batch, list(taps.inputs), taps.top, cache, name, torch.minimum(first, batch.read_index.cpu()))

    def positions(self, tb: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's computed positions [r, S] (past its end: its last position again) and which are real."""
        first, length = self.start[tb], self.length[tb]
        span = int((length - first).max())
        at = first[:, None] + torch.arange(span)[None]
        return torch.minimum(at, length[:, None] - 1), at < length[:, None]

    def run(self, model: RewardModel, start: int, tb: Tensor, edits: list[Overwrite]) -> Tensor:
        """Layers `start`..L-1 of rows `tb` [r] (batch rows, repeats allowed) over their suffixes, with
        `edits` (columns counted from each row's start): the last layer's output [r, S, d]."""
        at, _ = self.positions(tb)
        device = model.device
        rows = tb.to(device)[:, None]
        hidden = self.inputs[start][rows, at.to(device)].contiguous()
        mask = continuation_mask(self.start[tb].to(device), self.batch.input_ids.shape[1], at.shape[1], hidden.dtype)
        try:
            cache = cache_rows(self.cache, tb)
            kwargs = {"input_ids": self.batch.input_ids[rows, at.to(device)], "attention_mask": mask,
                      "position_ids": at.to(device), self.name: cache, "use_cache": True}
            args, layer_kwargs = continuation_args(model, model.forward_kwargs(**kwargs))
            with torch.no_grad(), eval_mode(model.model), patched(model, edits):
                for index in range(start, model.n_layers):
                    hidden = first_output(model.layers[index](hidden, *args, **layer_kwargs))
        except OOM_ERRORS:
            raise
        except (RuntimeError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise Declined from exc
        return hidden

    @staticmethod
    def rewards(model: RewardModel, hidden: Tensor, at: Tensor, tb: Tensor) -> Tensor:
        """Rewards [r] read at position `at` [r] of each row's last layer output [r, S, d]."""
        x = hidden[torch.arange(len(tb), device=hidden.device), at.to(hidden.device)].float().to(model.device)
        return (model.head(model.final_hidden(x)) * model.head.coefficients(len(tb))).sum(-1)

    def proves(self, model: RewardModel) -> bool:
        """Do unpatched continuations from layer 0 reproduce the clean run at every computed position (to
        `proof_tol`)? Rows go reversed and twice over, so a cache row or argument matched to the wrong run shows."""
        tol = proof_tol(model)
        if tol is None:
            return False
        size = len(self.start)
        tb = torch.arange(size - 1, -1, -1).repeat(2)
        mine = self.run(model, 0, tb, [])
        at, real = self.positions(tb)
        want = self.top[tb.to(self.top.device)[:, None], at.to(self.top.device)]
        return agrees(mine[real.to(mine.device)], want[real.to(want.device)], tol)
