"""The patching engine: many patched runs per batched forward, each equal to its own full forward.

A *site* is a patchable part (embeddings, an attention or MLP sublayer, one attention head, one MLP
neuron: a head or a neuron is its columns of the output projection's input); an
*edit* overwrites a site's activation on some rows, at some positions, with given values. Two
sweeps run edits:

- `read_sweep` (causal decoders, read position only). Patching only `t*` leaves every earlier
  position untouched, so one row holds the prefix once followed by P copies of the read token,
  each copy seeing the prefix and itself (a custom 4-D attention mask, position id `t*` for every
  copy) and carrying a different site's edit. A whole sweep then costs about one token per site
  instead of one forward per site; the prefix keys and values are computed once per row, inside
  the same forward. Copies recompute the layers below their patch too (identical to the clean
  run), which at most doubles the per-copy cost and keeps the engine free of per-architecture
  layer calls.
- `batched_sweep` (any positions, and every encoder): one row per (sequence, site), batched along
  the batch dimension, each a full forward of the target with its edit; the model's own masks,
  pooling-side gate and all.

Both read the head at the read position in fp32 and can also return the residual stream after
every layer there (for divergence scores).
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

import torch
from torch import Tensor, nn

from ..errors import UsageError
from ..model import Part, RewardModel, TraceKey
from ..model.internal import (
    OOM_ERRORS,
    Point,
    Tokenized,
    additive_mask,
    capture,
    collate,
    each_batch,
    eval_mode,
    is_moe_layer,
    out_projection,
    projection_inputs,
    rewriting,
)
from ..types import PatchLevel

PATCH_LEVELS: tuple[PatchLevel, ...] = get_args(PatchLevel)
K = TypeVar("K", bound=Hashable)
"""The key of a capture point: a `TraceKey`, or one of an engine's own (the unpatched copies)."""


class Declined(Exception):
    """An engine cannot run on this model or batch (its proof failed, or the model refused a call);
    the caller falls back to the next engine. Never raised for out-of-memory, which backs off."""


@dataclass(frozen=True)
class Site(Part):
    """A patchable part: the embeddings, a sublayer, one attention head or one MLP neuron (`Part` names it)."""

    @property
    def key(self) -> TraceKey:
        """Trace key of the activation the site overwrites (heads, neurons: the output projection's input)."""
        if self.kind == "embed":
            return TraceKey.embed()
        if self.head is not None:
            return TraceKey.attn_z(self.layer)
        return TraceKey.mlp_act(self.layer) if self.neuron is not None else TraceKey.sublayer(self.kind, self.layer)

    @property
    def column(self) -> bool:
        """Whether the site is some columns of its output projection's input (a head or a neuron)."""
        return self.head is not None or self.neuron is not None


def sites(model: RewardModel, level: PatchLevel) -> list[Site]:
    """Every patchable site at `level` ('sublayer' or 'head'), named as `rewardlens.attribute` names parts.

    Bias parts are constants (the same in every run), so they are not sites. Level 'neuron' has no
    sweep of every site here: one patched run per MLP neuron is too many (`causal/_neurons.py` chooses
    neurons, or lists every one for attribution patching's single backward).
    """
    if level == "neuron":
        n = sum(projection_inputs(model, "mlp", layer)[0] for layer in range(model.n_layers)
                if not is_moe_layer(model, layer))
        raise UsageError(f"level='neuron' patches only chosen neurons: a sweep of all {n} MLP neurons would be {n} "
                         "patched runs per pair; choose neurons=['mlp_L<l>_N<i>', ...] or use attribution patching "
                         "(attribution_patch(..., level='neuron'): every neuron from one backward)", option="level")
    if level not in PATCH_LEVELS:
        raise UsageError(f"patching level must be one of {PATCH_LEVELS}, got {level!r}", option="level")
    out = [Site.embed()]
    for layer in range(model.n_layers):
        if level == "head":
            out += [Site.attn(layer, h) for h in range(model.n_heads)]
        else:
            out.append(Site.attn(layer))
        out.append(Site.mlp(layer))
    return out


def neuron_layers(sweep: Sequence[Part]) -> list[int]:
    """The layers whose MLP neurons `sweep` patches: the layers a clean trace must keep the neurons of."""
    return sorted({s.layer for s in sweep if s.neuron is not None})


def site_point(model: RewardModel, site: Site, cols: Tensor) -> Point:
    """Where a site's activation lives: layer 0's input, or a sublayer output projection's output
    (its input, for heads)."""
    if site.kind == "embed":
        return Point(model.layers[0], "in", cols)
    path = model.arch.attn_out if site.kind == "attn" else model.arch.mlp_out
    return Point(model.layer_module(site.layer, path), "in" if site.column else "out", cols)


def head_slice(model: RewardModel, site: Site) -> slice:
    """Columns of the output projection's input that belong to `site`'s head, or its one neuron."""
    if site.neuron is not None:
        return slice(site.neuron, site.neuron + 1)
    if site.head is None:
        return slice(None)
    width = projection_inputs(model, "attn", site.layer)[0]
    size = width // model.n_heads
    return slice(site.head * size, (site.head + 1) * size)


def head_write(model: RewardModel, site: Site, z: Tensor) -> Tensor:
    """What head `site` writes to its attention output [..., d] from the output projection's input
    z [..., H·d_head] (its own columns only, fp32): z_h W_O[:, h]ᵀ, no bias (the bias is no head's).
    A neuron site likewise: a_n W_down[:, n]ᵀ from the MLP's projection input [..., d_mlp]."""
    sl = head_slice(model, site)
    weight, _ = out_projection(model, "mlp" if site.neuron is not None else "attn", site.layer)
    return z[..., sl].float() @ weight[:, sl].T.to(z.device)


@dataclass(frozen=True)
class Overwrite:
    """Overwrite `site` on rows `rows` [r] at positions `cols` [r, m] with `values` [r, m, w]."""

    site: Site
    rows: Tensor
    cols: Tensor
    values: Tensor


def take_values(values: Tensor, rows: Tensor, sl: slice, *, read: bool = False) -> Tensor:
    """Overwrite values for `rows`: `values` is per sequence ([n, w] at the read position, [n, m, w]
    over positions) or one vector [w] for every row and position (ablation)."""
    if values.ndim == 1:
        return values[sl]
    picked = values[rows.to(values.device)][..., sl]
    return picked[:, None] if read else picked


def _overwrite(x: Tensor, edits: list[tuple[Overwrite, slice]]) -> Tensor:
    x = x.clone()
    for edit, cols in edits:
        rows = edit.rows.to(x.device)[:, None]
        x[rows, edit.cols.to(x.device), cols] = edit.values.to(device=x.device, dtype=x.dtype)
    return x


@contextlib.contextmanager
def patched(model: RewardModel, edits: list[Overwrite]) -> Iterator[None]:
    """Apply `edits` during the forward passes inside; hooks are removed on exit, also on error."""
    groups: dict[tuple[int, str], list[tuple[Overwrite, slice]]] = defaultdict(list)
    modules: dict[tuple[int, str], nn.Module] = {}
    for edit in edits:
        point = site_point(model, edit.site, edit.cols)
        key = (id(point.module), point.where)
        modules[key] = point.module
        groups[key].append((edit, head_slice(model, edit.site)))

    hooks = [(modules[key], key[1], functools.partial(_overwrite, edits=group)) for key, group in groups.items()]
    with rewriting(hooks):
        yield


def resid_points(model: RewardModel, cols: Tensor) -> dict[TraceKey, Point]:
    """The residual after every layer, at positions `cols`."""
    return {TraceKey.resid(layer): Point(model.layers[layer], "out", cols) for layer in range(model.n_layers)}


def _forward(
    model: RewardModel, kwargs: dict[str, Any], points: Mapping[K, Point], edits: list[Overwrite]
) -> dict[K, Tensor]:
    kwargs = model.forward_kwargs(**kwargs)
    with torch.no_grad(), eval_mode(model.model), capture(points, model.device) as captured, patched(model, edits):
        model.backbone(**kwargs)
    return captured


def read_sweep(
    model: RewardModel,
    seqs: list[Tokenized],
    read: list[int],
    sweep: list[Site],
    values: dict[TraceKey, Tensor],
    coef: Tensor,
    *,
    batch_size: int = 8,
    chunk: int = 512,
    resid: Callable[[Tensor], Tensor] | None = None,
    index: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor | None] | None:
    """Clean rewards [n] and patched rewards [n, S] of every sequence, each site of `sweep`
    overwritten at the read position `read[i]` by `values[site.key][i]` ([n, width]); readout
    coefficients `coef` [n, k] are the clean run's (the gate reads an earlier position, which the
    patch cannot change). With `resid`, also `resid(x)` of the residual after every layer at each
    patched copy (`x` [..., L, d] → [..., L], e.g. divergence ratios), as [n, S, L].

    Every row also carries two unpatched copies, first and last; they must agree, which proves
    that a copy's output does not depend on its column (a model that ignores `position_ids`,
    ALiBi, a mask it rewrites). None when that proof fails or the model refuses the 4-D mask:
    the caller then runs full forwards. `index`: each sequence's number in the caller's input (for
    `OutOfMemoryError`, should a sequence not fit in memory alone).
    """
    n, n_sites = len(seqs), len(sweep)
    clean = torch.zeros(n, device=model.device)
    rewards = torch.zeros(n, n_sites, device=model.device)
    streams = torch.zeros(n, n_sites, model.n_layers, device=model.device) if resid else None
    dtype = next(model.model.parameters()).dtype
    ran = False  # a failure on the very first forward means the model refuses the copies' mask

    def work(batch_rows: list[int]) -> None:
        nonlocal ran
        rows = torch.tensor(batch_rows)
        for lo in range(0, n_sites, chunk):
            part = sweep[lo : lo + chunk]
            kwargs, cols = _copies_batch(model, [seqs[i] for i in rows], [read[i] for i in rows], len(part) + 2,
                                         dtype)
            edits = [
                Overwrite(site, torch.arange(len(rows)), cols[:, 1 + j : 2 + j],
                     take_values(values[site.key], rows, head_slice(model, site), read=True))
                for j, site in enumerate(part)
            ]
            # The patched copies' final residuals, plus two unpatched copies ('first', 'last': engine-local keys).
            points: dict[TraceKey | str, Point] = {
                TraceKey.final(): model.final_point(cols[:, 1:-1]), "first": model.final_point(cols[:, 0]),
                "last": model.final_point(cols[:, -1])}
            if resid:
                points.update(resid_points(model, cols[:, 1:-1]).items())
            try:
                captured = _forward(model, kwargs, points, edits)
            except OOM_ERRORS:
                raise
            except (RuntimeError, ValueError, TypeError) as exc:
                if not ran:  # the model will not take the copies' mask
                    raise Declined from exc
                raise
            ran = True
            gap = (captured["first"] - captured["last"]).norm(dim=-1) / captured["first"].norm(dim=-1).clamp_min(1e-12)
            if gap.max() > 1e-3:
                raise Declined
            finals = captured[TraceKey.final()].flatten(0, 1)  # [B * patched copies, d]
            objectives = model.head(model.final_hidden(finals)).view(len(rows), len(part), -1)
            rewards[rows, lo : lo + len(part)] = (objectives * coef[rows][:, None]).sum(-1)
            clean[rows] = (model.head(model.final_hidden(captured["first"])) * coef[rows]).sum(-1)
            if resid and streams is not None:
                stacked = torch.stack([captured[TraceKey.resid(layer)] for layer in range(model.n_layers)], dim=2)
                streams[rows, lo : lo + len(part)] = resid(stacked)

    try:
        each_batch(sorted(range(n), key=lambda i: len(seqs[i].ids)), batch_size, work, ids=index, is_pairs=True,
                   lengths=[len(s.ids) for s in seqs])  # a short target is not padded to a long one
    except Declined:
        return None
    return clean, rewards, streams


def _copies_batch(
    model: RewardModel, seqs: list[Tokenized], read: list[int], copies: int, dtype: torch.dtype
) -> tuple[dict[str, Any], Tensor]:
    """Rows `prefix + copies × read token`, the 4-D mask that keeps copies apart, and copy columns [B, copies]."""
    device, pad = model.device, model.pad_token_id if model.pad_token_id is not None else 0
    t = torch.tensor(read, device=device)
    width = int(t.max()) + copies
    ids = torch.full((len(seqs), width), pad, dtype=torch.long, device=device)
    for row, (seq, at) in enumerate(zip(seqs, read)):
        ids[row, :at] = torch.tensor(seq.ids[:at], device=device)
        ids[row, at : at + copies] = seq.ids[at]
    i = torch.arange(width, device=device)[None, :, None]
    j = torch.arange(width, device=device)[None, None, :]
    tt = t[:, None, None]
    allow = ((i < tt) & (j <= i)) | ((i >= tt) & (i < tt + copies) & (j < tt)) | (i == j)
    positions = torch.minimum(torch.arange(width, device=device)[None], t[:, None])
    cols = t[:, None] + torch.arange(copies, device=device)[None]
    kwargs = {"input_ids": ids, "attention_mask": additive_mask(allow, dtype), "position_ids": positions,
              "use_cache": False}
    return kwargs, cols


def batched_sweep(
    model: RewardModel,
    seqs: list[Tokenized],
    sweep: list[Site],
    cols: Tensor,
    values: dict[TraceKey, Tensor],
    *,
    batch_size: int = 8,
    resid: Callable[[Tensor], Tensor] | None = None,
    labels: list[str] | None = None,
    index: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Patched rewards [n, S]: sequence i run whole with site s overwritten at positions `cols[i]`
    [n, m] by `values[s.key][i]` [n, m, width] (or one vector [width] everywhere). Repeated columns are
    allowed (they pad rows with fewer positions). The gate, if any, is the patched run's own.
    `index`: each sequence's number in the caller's input (for `OutOfMemoryError`).
    """
    n, n_sites = len(seqs), len(sweep)
    rewards = torch.zeros(n, n_sites, device=model.device)
    streams = torch.zeros(n, n_sites, model.n_layers, device=model.device) if resid else None
    jobs = [(i, s) for i in sorted(range(n), key=lambda i: len(seqs[i].ids)) for s in range(n_sites)]

    def work(numbers: list[int]) -> None:
        job = [jobs[j] for j in numbers]
        seq_idx = torch.tensor([i for i, _ in job])
        batch = collate([seqs[i] for i, _ in job], pad_id=model.pad_token_id, side="right", first=model.encoder,
                        device=model.device, labels=[labels[i] for i, _ in job] if labels else None)
        by_site: dict[int, list[int]] = defaultdict(list)
        for row, (_, s) in enumerate(job):
            by_site[s].append(row)
        edits = [
            Overwrite(sweep[s], torch.tensor(rows), cols[seq_idx[rows]],
                      take_values(values[sweep[s].key], seq_idx[rows], head_slice(model, sweep[s])))
            for s, rows in by_site.items()
        ]
        points = dict(model.final_points(batch))
        if resid:
            points.update(resid_points(model, batch.read_index))
        captured = _forward(model, model.batch_kwargs(batch), points, edits)
        values_, coef = model.head_readout(captured, batch)
        reward = (values_ * coef).sum(-1)
        fold = model.fold(batch, reward)  # multi-position read-outs: the patched run's own combination
        rewards[seq_idx, [s for _, s in job]] = reward if fold is None else fold @ reward
        if resid and streams is not None:
            stacked = torch.stack([captured[TraceKey.resid(layer)] for layer in range(model.n_layers)], dim=1)
            streams[seq_idx, [s for _, s in job]] = resid(stacked)

    # A run that fits in no batch is reported by its sequence (the loop's rows are (sequence, site) jobs).
    each_batch(range(len(jobs)), batch_size, work, ids=[index[i] if index else i for i, _ in jobs], is_pairs=True)
    return rewards, streams
