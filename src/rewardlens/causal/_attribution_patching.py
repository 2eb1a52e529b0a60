"""`attribution_patch`: the first-order estimate of every part's patching effect from one backward pass.

`Δr ≈ Σ_positions (a_src − a_tgt) · ∂r/∂a` for every site at once (Nanda's attribution patching).
The gradient is taken through a zero tensor added to each site's activation, so no graph is cut
and the user's parameters collect no `.grad`. A gate, if any, is held at its clean value: exact
for read-position patching (the gate reads an earlier position), an approximation more for
whole-sequence patching of a gated head, whose exact runs recompute the gate. The
result is a `Patching` with `approximate=True`; `agreement` says how well it ranks parts against
exact patching wherever both were computed.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from ..data import Inputs, Pair
from ..data.internal import counting
from ..errors import UsageError
from ..model import RewardModel, TraceKey
from ..model.internal import (
    OOM_ERRORS,
    Batch,
    Point,
    Recording,
    Tokenized,
    cache_name,
    cached_forward,
    capture,
    collate,
    continuable,
    continuation_mask,
    each_batch,
    eval_mode,
    fork_cache,
    reproduces,
    rewriting,
)
from ..stats import rank_agreement
from ..types import Ablation, Mode, PatchLevel, Positions, Spans
from ._engine import Site, head_slice, neuron_layers, site_point
from ._layerwise import ProbeContext, Recorded, layerwise_grads
from ._neurons import Neurons, check_traced, level_sites
from ._patching import Patching, assemble
from ._plan import Clean, PatchPlan, pair_seqs
from ._reads_patch import ReadChunks, check_reads_options, mode_for
from ._registry import Provenance
from ._spec import PatchSpec, spec_of

Tensors = dict[TraceKey, Tensor]


@contextlib.contextmanager
def _probes(points: dict[TraceKey, Point], final: Point) -> Iterator[tuple[Tensors, Tensors, Tensors]]:
    """Add a zero leaf to each point's activation (→ its gradient is ∂r/∂a) and keep the activation
    and the final residual (with its graph)."""
    deltas: Tensors = {}
    acts: Tensors = {}
    out: Tensors = {}

    def touch(name: TraceKey, x: Tensor) -> Tensor:
        delta = torch.zeros_like(x, requires_grad=True)
        deltas[name], acts[name] = delta, x.detach()
        return x + delta

    def keep(x: Tensor) -> None:
        rows = torch.arange(x.shape[0], device=x.device) if final.rows is None else final.rows.to(x.device)
        out[TraceKey.final()] = x[rows, final.cols.to(x.device)]

    hooks = [(p.module, p.where, functools.partial(touch, name)) for name, p in points.items()]
    with rewriting([*hooks, (final.module, final.where, keep)]):
        yield deltas, acts, out


def _probes_of(model: RewardModel, keys: dict[TraceKey, Site], batch: Batch) -> ProbeContext:
    """`_probes` at every site of `keys` on `batch` (read position and final point by its rows)."""
    final = model.final_points(batch, gate=False)[TraceKey.final()]
    points = {k: site_point(model, site, batch.read_index) for k, site in keys.items()}
    return lambda: _probes(points, final)


def _whole_grads(model: RewardModel, batch: Batch, points: dict[TraceKey, Point], final: Point,
                 coef: Tensor) -> tuple[Tensors, Tensors]:
    """(activations, ∂r/∂activation) at every point from one backward through the whole forward."""
    with torch.enable_grad(), eval_mode(model.model), _probes(points, final) as (deltas, acts, out):
        model.backbone(**model.batch_kwargs(batch))
        # Layers may sit on several devices (device_map); the head and its norm live on model.device.
        objectives = model.head_values(model.final_hidden(out[TraceKey.final()].float().to(model.device)), batch)
        per = (objectives * (coef if batch.reads is None else coef[:1])).sum(-1)
        fold = model.fold(batch, per.detach())  # multi-position read-outs: α frozen at the clean run
        reward = per.sum() if fold is None else (fold @ per).sum()
        names = list(deltas)
        return acts, dict(zip(names, torch.autograd.grad(reward, [deltas[k] for k in names])))


def _read_token_grads(model: RewardModel, batch: Batch, coef: Tensor, keys: dict[TraceKey, Site],
                      rec: Recording | None = None) -> tuple[Tensors, Tensors] | None:
    """(activations, ∂r/∂a) of every site of `keys` at each row's read token, each [B, 1, w]; None when
    this model's cache cannot be continued this way.

    In a causal decoder the read token t* is seen by no earlier position, so a site's activation at t*
    reaches the reward only along t*'s own stream: the read token alone, continuing the clean run's
    keys and values of positions < t* (no gradient through them), gives the exact gradient at a cost
    of one token per layer instead of a backward through every position. The continuation's final
    state must equal the clean run's at t* (the proof, as in `cached_read_sweep`). `rec`: the clean
    run's cache as the trace kept it (`LayerTaps(cache=True)`, rows and width of `rec.batch`), so no
    clean forward runs here."""
    name = cache_name(model)
    if name is None or model.encoder:
        return None
    batch = batch if rec is None else rec.batch
    at = batch.read_index.to(model.device)
    try:
        got = _clean_cache(model, batch, at) if rec is None or rec.cache is None else (
            rec.cache, rec.top[torch.arange(len(at), device=rec.top.device), at.to(rec.top.device)])
        if got is None:
            return None
        cache, want = got
        b, width = batch.input_ids.shape
        # The read token sees positions < t* of the cache (not the clean read token, nor pads) and itself.
        mask = continuation_mask(at, width, 1, next(model.model.parameters()).dtype)
        ids = batch.input_ids[torch.arange(b, device=model.device), at][:, None]
        step = model.forward_kwargs(input_ids=ids, attention_mask=mask, position_ids=at[:, None], use_cache=True,
                                    **{name: fork_cache(cache)})
        zero = torch.zeros(b, dtype=torch.long, device=model.device)
        points = {k: site_point(model, site, zero) for k, site in keys.items()}
        with torch.enable_grad(), eval_mode(model.model), _probes(points, model.final_point(zero)) as (d, acts, o):
            model.backbone(**step)
            last = o[TraceKey.final()]
            reward = (model.head(model.final_hidden(last.float().to(model.device))) * coef).sum()
            names = list(d)
            grads = dict(zip(names, torch.autograd.grad(reward, [d[k] for k in names])))
    except OOM_ERRORS:
        raise
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if not reproduces(model, last.detach(), want):
        return None
    return acts, grads


def _clean_cache(model: RewardModel, batch: Batch, at: Tensor) -> tuple[Any, Tensor] | None:
    """One clean forward of `batch` keeping the model's cache: (the cache, the final point at `at` [B, d])."""
    with capture({TraceKey.final(): model.final_point(at)}, model.device) as clean:
        cache = cached_forward(model, batch)
    return None if cache is None else (cache, clean[TraceKey.final()])


def _grads(model: RewardModel, seqs: list[Tokenized], index: list[int], rec: Recording | None, coef: Tensor,
           keys: dict[TraceKey, Site], *, at_read: bool) -> tuple[Tensors, Tensors, bool]:
    """(activations, gradients) of targets `index` (coefficients `coef[index]`), and whether they are
    [B, 1, w] at the read token alone: the read token continuing the clean cache where the read position
    is patched (`at_read`) on a causal decoder; else one layer at a time where stepping reproduces the
    model (memory: one layer's activations), from the trace's own recording of layer inputs where it
    made one (and, where that fails its proof, as if it had made none); else one backward of the whole."""
    batch = collate([seqs[i] for i in index], pad_id=model.pad_token_id, side="right", first=model.encoder,
                    device=model.device)
    # The trace keeps a cache only where the model is continuable (`trace_pairs`).
    cached = rec is not None and rec.cache is not None
    if at_read and (cached or continuable(model, [seqs[i] for i in index])):
        read = _read_token_grads(model, batch, coef[index], keys, rec)
        if read is not None:
            return (*read, True)
    if rec is not None and rec.cache is None:
        got = layerwise_grads(model, rec.batch, coef[index], _probes_of(model, keys, rec.batch), rec=rec)
        if got is not None:
            return (*got, False)
    got = layerwise_grads(model, batch, coef[index], _probes_of(model, keys, batch))
    if got is not None:
        return (*got, False)
    final = model.final_points(batch, gate=False)[TraceKey.final()]
    points = {k: site_point(model, site, batch.read_index) for k, site in keys.items()}
    return (*_whole_grads(model, batch, points, final, coef[index]), False)


def attribution_patch(
    model: RewardModel,
    pairs: Sequence[Pair],
    *,
    mode: Mode | None = None,
    ablation: Ablation = "zero",
    positions: Positions | Spans = "read",
    level: PatchLevel = "sublayer",
    reference: Inputs | None = None,
    batch_size: int = 8,
    min_margin: float = 1e-4,
    clean: Clean | None = None,
    progress: bool = False,
    spec: PatchSpec | None = None,
    neurons: Neurons | None = None,
) -> Patching:
    """Attribution-patching estimate of `patch(model, pairs, ..., estimand='total')` (same arguments).

    One forward and one backward pass over the patched side only (the targets); `clean`: the pairs'
    clean runs when the caller already traced them (`trace_pairs`), else they are traced here.
    `spec`: the choices as one `PatchSpec` (its estimand 'total') instead of the keywords. `mode` None
    is `patch`'s default: zero ablation at every read where a set of reads has no read-to-read map, then
    estimated as `−Σ_k a_k · ∂r/∂a_k` over each side's reads (`_reads_estimate`). `level='neuron'`: every
    MLP neuron (plus the embeddings and attention sublayers) from the same one backward, or only the chosen
    `neurons`; a neuron's estimate is `Σ_positions (a_src − a_tgt) · ∂r/∂a` of its one activation."""
    with counting("attribution patching", progress):
        seqs = pair_seqs(model, pairs, clean)
        given = mode if spec is not None else mode_for(model, pairs, mode, seqs)
        spec = spec_of(spec, mode=given, ablation=ablation, positions=positions, level=level)
        if spec.estimand != "total":
            raise UsageError(f"attribution patching estimates total effects; got {spec}: use estimand='total'",
                             option="estimand")
        mode, ablation, positions, level = spec.mode, spec.ablation, spec.positions, spec.level
        sweep = level_sites(model, level, neurons, every=True)
        if model.reads.multi:
            check_reads_options(mode, ablation, positions, False)
            runs, targets, rewards = _reads_estimate(model, seqs, sweep, mode, level, batch_size)
            return assemble(pairs, runs.reward, targets, rewards, sweep, spec=spec, approximate=True,
                            min_margin=min_margin, provenance=Provenance("attribution_patch (set of reads)"))
        if clean is None:
            clean = Clean.run(model, seqs, heads=level == "head", batch_size=batch_size, neurons=neuron_layers(sweep))
        check_traced(clean, sweep)
        ref_seqs = None if reference is None else model.encode(reference)[0]
        plan = PatchPlan.make(model, clean, sweep, mode, ablation, positions, ref_seqs, batch_size)
        cols, valid, values = plan.at_columns(clean)
        keys = {s.key: s for s in sweep}
        estimate = torch.zeros(len(plan.targets), len(sweep), device=model.device)

        # The targets' layer inputs when the trace recorded them (`trace_pairs(record=)`): taken, so the
        # caller's `Clean` stops holding them, and dropped when this call returns; the model's caches stay
        # for the read-position sweep, which continues them (`cached_read_sweep(held=)`).
        recorded = clean.recorded.take(leave_caches=True) if clean.recorded is not None else Recorded()

        def work(batch_rows: list[int]) -> None:
            index = [plan.targets[r] for r in batch_rows]
            for js, rec in recorded.groups(index):
                acts, grads, alone = _grads(model, seqs, [index[j] for j in js], rec, clean.coef, keys,
                                            at_read=plan.cols is None)
                rows = torch.tensor([batch_rows[j] for j in js])
                c = torch.zeros_like(cols[rows]) if alone else cols[rows]
                r = torch.arange(len(rows), device=model.device)[:, None]
                mask = valid[rows].to(model.device, torch.float32)[..., None]
                terms: Tensors = {}  # per key, Σ_positions (a_src − a_tgt) · ∂r/∂a, every column [rows, w]
                for key in keys:
                    a, g = acts[key], grads[key]
                    act = a[r.to(a.device), c.to(a.device)].float().to(model.device)
                    grad = g[r.to(g.device), c.to(g.device)].float().to(model.device)
                    src = values[key]
                    src = src if src.ndim == 1 else src[rows.to(src.device)]
                    terms[key] = ((src.float().to(model.device) - act) * grad * mask).sum(1)
                estimate[rows] = site_sums(model, sweep, terms)

        # Length-sorted batches pad little; on out-of-memory the batch halves (`each_batch`).
        lengths = [len(seqs[i].ids) for i in plan.targets]
        each_batch(sorted(range(len(lengths)), key=lengths.__getitem__), batch_size, work, ids=plan.targets,
                   is_pairs=True, lengths=lengths)
        rewards = clean.reward[plan.targets][:, None] + estimate
        return assemble(pairs, clean.reward, plan.targets, rewards, sweep, spec=spec, approximate=True,
                        min_margin=min_margin, provenance=Provenance("attribution_patch"))


def _reads_estimate(
    model: RewardModel, seqs: list[Tokenized], sweep: list[Site], mode: Mode, level: PatchLevel, batch_size: int,
) -> tuple[Clean, list[int], Tensor]:
    """Attribution patching at the set of reads (causal/_reads_patch.py): for each target sequence,
    `Σ_k (a_src,k − a_tgt,k) · ∂r/∂a_tgt,k` over its reads k, from one backward per batch."""
    chunks = ReadChunks(model, seqs, mode, level, batch_size)
    estimate = torch.zeros(len(chunks.targets), len(sweep))
    keys = {s.key: s for s in sweep}
    for lo, tgt, src, acts_at in chunks:
        batch = collate([seqs[i] for i in tgt], pad_id=model.pad_token_id, side="right", first=False,
                        device=model.device)
        assert batch.reads is not None  # a multi-position model's sequences carry their reads
        final = model.final_points(batch, gate=False)[TraceKey.final()]
        points = {k: site_point(model, site, batch.read_at) for k, site in keys.items()}
        acts, grads = _whole_grads(model, batch, points, final, model.head.coefficients(len(tgt)))
        rows, cols = batch.reads.rows, batch.reads.cols
        terms: Tensors = {}  # per key, Σ_reads (a_src − a_tgt) · ∂r/∂a, every column [targets, w]
        for key in keys:
            a, g = acts[key], grads[key]
            act = a[rows.to(a.device), cols.to(a.device)].float().to(model.device)
            grad = g[rows.to(g.device), cols.to(g.device)].float().to(model.device)
            if mode == "ablation":
                inserted = torch.zeros_like(act)
            else:
                inserted = torch.cat([acts_at[s][key] for s in src]).float().to(model.device)
            terms[key] = torch.zeros(len(tgt), act.shape[-1], device=model.device).index_add(
                0, rows.to(model.device), (inserted - act) * grad)
        estimate[lo:lo + len(tgt)] = site_sums(model, sweep, terms).cpu()
    runs = chunks.clean_runs()
    return runs, chunks.targets, (runs.reward[chunks.targets][:, None] + estimate.to(model.device))


def site_sums(model: RewardModel, sweep: list[Site], terms: Tensors) -> Tensor:
    """[r, S]: each site's estimate, the sum of its own columns of `terms[site.key]` [r, w] (a head's slice,
    a neuron's one column, a whole sublayer); a layer's neurons are gathered in one indexing, not one by one."""
    first = next(iter(terms.values()))
    out = torch.empty(first.shape[0], len(sweep), device=first.device)
    neurons: dict[TraceKey, tuple[list[int], list[int]]] = {}
    for j, site in enumerate(sweep):
        if site.neuron is not None:
            js, ns = neurons.setdefault(site.key, ([], []))
            js.append(j)
            ns.append(site.neuron)
        else:
            out[:, j] = terms[site.key][:, head_slice(model, site)].sum(-1)
    for key, (js, ns) in neurons.items():
        out[:, js] = terms[key][:, ns]
    return out


def agreement(exact: Patching, approx: Patching, k: int = 10) -> dict[str, float]:
    """How well `approx` ranks parts like `exact` (same pairs and parts): see `stats.rank_agreement`."""
    same = (exact.names == approx.names and exact.pair_ids == approx.pair_ids and exact.mode == approx.mode
            and exact.positions == approx.positions and exact.effect.shape == approx.effect.shape)
    if not same:
        raise UsageError(
            f"agreement compares two results of the same sweep; got {exact.mode}/{exact.positions} over "
            f"{exact.effect.shape} and {approx.mode}/{approx.positions} over {approx.effect.shape}")
    return rank_agreement(exact.effect, approx.effect, k)


__all__ = ["Site", "agreement", "attribution_patch"]
