"""`edges`: a score for every edge (upstream part → later node's input) from one forward and backward.

Edge attribution patching (EAP, Syed et al. 2023): the path-patching effect of sender u through
receiver d is, to first order, `−Σ_t Δ_u,t · ∂r/∂(input_d)_t` on the patched side (`Δ_u` as
`path_patch` defines it, the gradient from `_edge_grads.node_grads`), signed as `patch`'s margin
effect (clean margin − patched margin). EAP-IG (Hanna et al. 2024) averages the gradient over `steps`
points `α = k/steps`, k = 0..steps−1, on the line from the clean to the corrupted run in which every
node reads `x + α Σ_{u before it} Δ_u`: the upstream parts' writes are interpolated at the patched
columns, not the embeddings (`_lines`; steps=1 is EAP). The edges into 'reward' are not estimated: they
are path patching's direct effect, exactly (`_path.reward_path_rewards`, no forward); `verify=n`
path-patches the first n estimated ones (`_verify_edges`). A head upstream is scored in head
space, `Δz_h · (W_O[:, h]ᵀ g)` (`head_space`), so no head's Δ is held in d-space. Per batch of targets
the clean gradient pass also records the targets' activations and final residual, so only the sources
are traced beforehand (docs/circuits.md, Cost).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs, Pair, effect, margin, pair_ids, pair_of
from ..data.internal import counting
from ..errors import CircuitError, UsageError
from ..model import RewardModel, TraceKey
from ..model.internal import Tokenized, collate, each_batch, out_projection
from ..plotting import HtmlView
from ..stats import rank_agreement, top_parts
from ..types import Ablation, Mode, Positions, Spans
from ._edge_grads import chunk_scores, node_grads
from ._edge_nodes import Level, check_model, nodes
from ._engine import Site, head_write
from ._path import PathPatching, delta_keys, path_deltas, reward_path_rewards
from ._plan import Clean, PatchPlan, pair_seqs, sources_only
from ._receivers import Receiver, read_depth, wiring, write_depth
from ._registry import Provenance
from ._spec import PatchSpec, spec_of
from ._verify_edges import check_verify, verified_scores

if TYPE_CHECKING:
    import pandas as pd

Method = Literal["eap", "eap-ig"]


@dataclass(frozen=True)
class Edges(HtmlView):
    """Edge scores [n_pairs, U, D]: upstream part u → downstream node input d, in reward units of the
    margin effect (clean − patched margin, as `patch`'s). NaN where d reads before u writes. The
    'reward' column is exact (`path_patch` to the read-out), and so is every `verified` [U, D] edge
    (path-patched by `verify`); the rest are first-order estimates (`exact` says which is which)."""

    _html_top_names = ("upstream", "downstream", "mean score")

    upstream: list[str]
    downstream: list[str]
    score: np.ndarray
    margin: np.ndarray
    method: Method
    steps: int
    level: Level
    mode: Mode
    pair_ids: list[str]
    verified: np.ndarray | None = None

    @property
    def provenance(self) -> Provenance:
        """How the scores were computed: the estimator (`method`) and how many edges were path-patched exactly."""
        done = 0 if self.verified is None else int(self.verified.sum())
        return Provenance(self.method, proof=f"{done} edges verified by path patching" if done else None)

    @property
    def approximate(self) -> np.ndarray:
        """[D] True where the column was scored first-order (every node but 'reward'); per edge see `exact`."""
        return np.array([d != "reward" for d in self.downstream])

    @property
    def exact(self) -> np.ndarray:
        """[U, D] True where the score is exact: an edge into 'reward', or one path-patched (`verified`)."""
        done = np.zeros(self.score.shape[1:], bool) if self.verified is None else self.verified
        return ~self.approximate[None, :] | done

    def verify(self, model: RewardModel, pairs: Sequence[Pair], n: int, *, ablation: Ablation = "zero",
               positions: Positions | Spans = "read", reference: Inputs | None = None, batch_size: int = 8) -> Edges:
        """These edges with the estimated ones among the first `n` by mean |score| path-patched (this `mode`;
        pass the corruption they were scored under) until those `n` are all exact (`_verify_edges`)."""
        score, done = verified_scores(model, pairs, self.upstream, self.downstream, self.score, self.exact, n,
                                      ids=self.pair_ids, mode=self.mode, ablation=ablation, positions=positions,
                                      reference=reference, batch_size=batch_size)
        return dataclasses.replace(self, score=score, verified=done | (self.exact & self.approximate[None, :]))

    @property
    def valid(self) -> np.ndarray:
        """[U, D] whether the edge exists (d reads the stream at or after u writes it)."""
        return ~np.isnan(self.score[0]) if len(self.score) else np.zeros(self.score.shape[1:], bool)

    @property
    def names(self) -> list[tuple[str, str]]:
        """Every existing edge (u, d), in row-major order of `score`'s last two axes."""
        ok = self.valid
        return [(u, d) for i, u in enumerate(self.upstream) for j, d in enumerate(self.downstream) if ok[i, j]]

    def flat(self) -> np.ndarray:
        """Scores of the existing edges [n_pairs, E], in the order of `names`."""
        return self.score[:, self.valid]

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The `k` edges of largest mean |score| (`stats.top_parts`), with their signed mean score."""
        flat, names = self.flat(), self.names
        return [(*names[i], float(flat[:, i].mean())) for i in top_parts(flat, k)]

    def agreement(self, truth: np.ndarray | PathPatching | Sequence[PathPatching], k: int = 10, *,
                  estimated: bool = True) -> dict[str, float]:
        """How well these scores rank the edges like true edge patching, `stats.rank_agreement`'s dict
        (Spearman per pair and of the means, top-`k` overlap by |mean|, max |error|, plus `n_edges`).

        `truth`: effects [n_pairs, U, D] on this grid (NaN where unknown), or `path_patch` results
        whose (sender, receiver) cells are placed by name (one run per receiver, as receivers must read
        after every sender). Edges that do not exist or have no true value are left out; `estimated`
        also leaves out the exact edges ('reward', `verified`), so only first-order estimates are graded."""
        want = self.on_grid(truth)
        use = self.valid & np.isfinite(want).all(0)
        if estimated:
            use &= ~self.exact
        if not use.any():
            raise CircuitError("agreement needs at least one edge with a true value; pass path_patch results over "
                               f"these parts ({len(self.upstream)} upstream, {len(self.downstream)} downstream)")
        out = rank_agreement(want[:, use], self.score[:, use], k)
        return {**out, "n_edges": float(use.sum())}

    def on_grid(self, truth: np.ndarray | PathPatching | Sequence[PathPatching]) -> np.ndarray:
        """`truth` as effects [n_pairs, U, D] on this grid (NaN off the cells it covers)."""
        if isinstance(truth, np.ndarray):
            if truth.shape != self.score.shape:
                raise UsageError(f"truth has shape {truth.shape}, the scores {self.score.shape}: pass effects "
                                 "[n_pairs, U, D] on this grid or path_patch results")
            return truth
        runs = [truth] if isinstance(truth, PathPatching) else list(truth)
        out = np.full(self.score.shape, np.nan)
        for run in runs:
            if run.effect.shape[0] != self.score.shape[0]:
                raise UsageError(f"a path_patch result covers {run.effect.shape[0]} pairs, the scores "
                                 f"{self.score.shape[0]}: run path_patch on the pairs these edges were scored on")
            for i, u in enumerate(run.senders):
                for j, d in enumerate(run.receivers):
                    if u in self.upstream and d in self.downstream:
                        out[:, self.upstream.index(u), self.downstream.index(d)] = run.effect[:, i, j]
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per (pair, existing edge): upstream, downstream, score, and whether it is estimated."""
        import pandas as pd

        flat, names = self.flat(), self.names
        n, e = flat.shape
        return pd.DataFrame({
            "pair": np.repeat(self.pair_ids, e), "upstream": np.tile([u for u, _ in names], n),
            "downstream": np.tile([d for _, d in names], n), "score": flat.ravel(),
            "approximate": np.tile(~self.exact[self.valid], n)})


def edges(
    model: RewardModel,
    pairs: Sequence[Pair],
    *,
    method: Method = "eap",
    steps: int = 5,
    level: Level = "sublayer",
    qkv: bool = False,
    mode: Mode | None = None,
    ablation: Ablation = "zero",
    positions: Positions | Spans = "read",
    reference: Inputs | None = None,
    batch_size: int = 8,
    spec: PatchSpec | None = None,
    verify: int | None = None,
    progress: bool = False,
) -> Edges:
    """Score every edge of the model (docs/circuits.md): EAP (one forward and backward per batch of
    targets) or EAP-IG (`steps` of them). Corruption (`mode`, `ablation`, `positions`, `reference`,
    `spec`) is `patch`'s; `level='head'` scores heads (with `qkv`, each head's query, key and value
    inputs apart). `verify=n`: then path-patch the estimated edges among the first n (`Edges.verify`)."""
    if method not in ("eap", "eap-ig"):
        raise UsageError(f"method must be 'eap' or 'eap-ig', got {method!r}")
    if int(steps) < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    steps, n_verify = 1 if method == "eap" else int(steps), check_verify(verify)
    with counting("edges", progress):
        check_model(model, "edges")
        spec = spec_of(spec, mode=(mode or "noising") if spec is None else mode, ablation=ablation,
                       positions=positions)
        ups, downs = nodes(model, level, qkv)
        for d in downs:  # refuse what path patching refuses for a head (fused qkv, ...) before any forward
            if d.kind == "head":
                wiring(model, d)
        seqs = pair_seqs(model, pairs, None)
        clean = _clean_sources(model, seqs, level == "head", spec.mode, batch_size)
        ref = None if reference is None else model.encode(reference)[0]
        plan = PatchPlan.make(model, clean, ups, spec.mode, spec.ablation, spec.positions, ref, batch_size,
                              ids=pair_ids(pairs))
        est, reward = _estimate(model, clean, plan, ups, downs, steps, batch_size)
        score = _per_pair(est, plan.targets, len(seqs) // 2)
        ok = np.array([[read_depth(model, d) >= write_depth(model, u) for d in downs] for u in ups])
        score[:, ~ok] = np.nan
        out = Edges([u.name for u in ups], [d.name for d in downs], score, margin(reward), method,
                    steps, level, spec.mode, pair_ids(pairs))
        return out.verify(model, pairs, n_verify, ablation=spec.ablation, positions=spec.positions,
                          reference=reference, batch_size=batch_size) if n_verify else out


def _clean_sources(model: RewardModel, seqs: list[Tokenized], heads: bool, mode: Mode, batch_size: int) -> Clean:
    """The clean trace, of the sources only where it can be: the targets' clean values (activations at
    the patched columns, final residual, reward) come from the gradient pass, whose leaves are zeros,
    so tracing them too would run them twice. A gate's coefficients move with the input, and ablation
    patches every sequence: those trace everything (`sources_only`)."""
    return Clean.run(model, seqs, heads=heads, batch_size=batch_size, only=sources_only(model, mode, len(seqs)))


def _per_pair(est: Tensor, targets: list[int], n_pairs: int) -> np.ndarray:
    """Margin effects [n_pairs, U, D] from reward changes [n_targets, U, D]: a chosen target's change Δr moves
    the margin by +Δr, a rejected one's by −Δr, and the effect of a margin change is `data.effect(0, Δm)`."""
    out = np.zeros((n_pairs, *est.shape[1:]))
    for j, t in enumerate(targets):
        pair, which = pair_of(t)
        change = est[j].double().cpu().numpy()
        out[pair] += effect(0.0, change if which == "chosen" else -change)
    return out


def head_space(model: RewardModel, ups: list[Site]) -> list[int]:
    """Indices of the heads scored in head space, `Δz_h · (W_O[:, h]ᵀ g)`: exact where a head's write is
    linear in z (no attention post-norm, no residual norms between parts); elsewhere Δ_h is in d-space."""
    if model.arch.attn_post_norm is not None or model.arch.layout == "post_norm":
        return []
    return [s for s, u in enumerate(ups) if u.head is not None]


def _estimate(model: RewardModel, clean: Clean, plan: PatchPlan, ups: list[Site], downs: list[Receiver],
              steps: int, batch_size: int) -> tuple[Tensor, np.ndarray]:
    """Reward changes [n_targets, U, D] (first order; the 'reward' column exact) and every sequence's
    clean reward [N], one batch of targets at a time: per batch one clean gradient pass that also
    records the targets' activations, then Δ, then EAP-IG's further steps. Memory per batch: Δ
    [B, U', m, d] of the parts in d-space, Δz [B, L, m, H·d_head] of the heads, the non-head receivers'
    gradients [B, L + 1, m, d] (2L + 1 at sublayer level) and one layer's head gradients [B, n_x·H, m, d]
    at a time; never [B, D, m, d] nor [T, U, D, d]."""
    targets = plan.targets
    cols, valid, values = plan.at_columns(clean)
    zs = head_space(model, ups)
    dsp = [s for s in range(len(ups)) if s not in set(zs)]
    keys = {**delta_keys(model, [ups[s] for s in dsp]), **{ups[s].key: ups[s] for s in zs}}
    out = torch.zeros(len(targets), len(ups), len(downs), device=model.device)
    final = clean.captured[TraceKey.final()].clone()
    depth = {read_depth(model, d): k for k, d in reversed(list(enumerate(downs)))}

    def work(rows: list[int]) -> None:
        index = [targets[j] for j in rows]
        batch = collate([clean.seqs[i] for i in index], pad_id=model.pad_token_id, side="right",
                        first=model.encoder, device=model.device)
        c = cols[rows].to(model.device)
        first = node_grads(model, batch, clean.coef[index], downs, c, None, keys)
        final[index] = first.final
        vals = {k: v if v.ndim == 1 else v[rows] for k, v in values.items()}
        deltas = path_deltas(model, clean, index, c, valid[rows], vals, [ups[s] for s in dsp], downs, batch_size,
                             act=first.act)
        dz = head_changes(model, ups, zs, first.act, vals, valid[rows])
        # Scores are linear in g: the heads' are taken per pass, layer by layer while the pass's graph is
        # alive (freed by `del` before the next pass); the other nodes' g is small and summed first.
        est = _scores(model, ups, dsp, zs, deltas, dz, downs, first.heads(), len(rows)) / steps
        grad = first.grad / steps
        sub = list(first.rows)
        del first
        if steps > 1:
            lines = _lines(model, ups, dsp, deltas, dz, depth, c, batch.input_ids.shape[1])
            for k in range(1, steps):
                base = {name: line * (k / steps) for name, line in lines.items()}
                step = node_grads(model, batch, clean.coef[index], downs, c, base)
                grad += step.grad / steps
                est += _scores(model, ups, dsp, zs, deltas, dz, downs, step.heads(), len(rows)) / steps
                del step
        out[rows] = est + _scores(model, ups, dsp, zs, deltas, dz, downs, [(sub, grad)], len(rows))
        view = dataclasses.replace(clean, captured={TraceKey.final(): final})
        out[rows, :, -1] = _reward_column(model, view, index, c, ups, dsp, deltas, dz, len(downs) - 1)

    lengths = [len(clean.seqs[i].ids) for i in targets]
    each_batch(sorted(range(len(targets)), key=lengths.__getitem__), batch_size, work, ids=targets, is_pairs=True,
               lengths=lengths)
    # The targets' clean rewards from the gradient pass's final residual, as the 'reward' column reads it
    # (so a zero Δ changes nothing, bit for bit), also where the trace covered them.
    reward = clean.reward.clone()
    at = torch.tensor(targets, device=model.device)
    reward[at] = (model.head(model.final_hidden(final[at])) * clean.coef[at]).sum(-1)
    out[:, :, -1] -= reward[at][:, None]
    return out, reward.cpu().numpy()


def head_changes(model: RewardModel, ups: list[Site], zs: list[int], act: dict[TraceKey, Tensor],
                 values: dict[TraceKey, Tensor], valid: Tensor) -> dict[int, Tensor]:
    """Per layer with head-space heads, Δz [B, m, H·d_head]: the corrupted minus the clean output-projection
    input at the patched columns (zero where not valid), every head's columns at once."""
    out: dict[int, Tensor] = {}
    keep = valid.to(model.device)[..., None]
    for layer in sorted({ups[s].layer for s in zs}):
        key = TraceKey.attn_z(layer)
        old, new = act[key], values[key].to(act[key].device)
        out[layer] = ((new.expand_as(old) if new.ndim == 1 else new) - old) * keep
    return out


def _scores(model: RewardModel, ups: list[Site], dsp: list[int], zs: list[int],
            deltas: dict[tuple[int, int], Tensor], dz: dict[int, Tensor], downs: list[Receiver],
            chunks: Iterable[tuple[list[int], Tensor]], b: int) -> Tensor:
    """First-order reward changes [b, U, D] into the downstream nodes of `chunks` (indices in `downs`,
    their g [b, n, m, d]; zeros elsewhere), one chunk at a time, so no [B, D, m, d] gradient is ever held. A
    chunk meets only the heads written before its nodes read (the rest are NaN in `edges`)."""
    out = torch.zeros(b, len(ups), len(downs), device=model.device)
    for index, g in chunks:
        reads = max(read_depth(model, downs[k]) for k in index)
        before = {layer: z for layer, z in dz.items() if write_depth(model, Site.attn(layer)) <= reads}
        out[:, :, index] = chunk_scores(model, ups, dsp, zs, deltas, before, index, g)
    return out


def _heads_write(model: RewardModel, layer: int, z: Tensor) -> Tensor:
    """What every head of `layer` together writes for a change Δz [..., H·d_head]: Δz @ W_Oᵀ [..., d]."""
    weight, _ = out_projection(model, "attn", layer)
    return z @ weight.to(z.device).T


def _reward_column(model: RewardModel, clean: Clean, index: list[int], cols: Tensor, ups: list[Site],
                   dsp: list[int], deltas: dict[tuple[int, int], Tensor], dz: dict[int, Tensor], k: int) -> Tensor:
    """The exact 'reward' column [B, U]: path-frozen rewards (`reward_path_rewards`) with each part's Δ at
    the read column alone (a head's as Δz_h W_O[:, h]ᵀ there), so no [B, U, m, d] tensor is built; every
    (part, target) is one row of a single read-out call."""
    read = torch.tensor([clean.read[i] for i in index], device=model.device)
    rows = torch.arange(len(index), device=model.device)
    at = (cols == read[:, None]).float().argmax(1)
    one: list[Tensor] = []
    pos = {s: j for j, s in enumerate(dsp)}
    for s, u in enumerate(ups):
        if s in pos:
            one.append(deltas[pos[s], k][rows, at])
        else:
            assert u.head is not None  # every part not in d-space is a head-space head
            one.append(head_write(model, u, dz[u.layer][rows, at]))
    stacked = torch.stack(one).flatten(0, 1)[:, None]  # [U·B, 1, d], part-major
    got = reward_path_rewards(model, clean, index * len(ups), cols[rows, at][:, None].repeat(len(ups), 1),
                              {(0, 0): stacked}, 1, 0)
    return got.view(len(ups), len(index)).T


def _lines(model: RewardModel, ups: list[Site], dsp: list[int], deltas: dict[tuple[int, int], Tensor],
           dz: dict[int, Tensor], depth: dict[int, int], c: Tensor, t: int) -> dict[str, Tensor]:
    """EAP-IG's direction [b, T, d] per sublayer receiver and 'reward': Σ_u Δ_u over every upstream part
    written before it reads (at α = 1 every node reads the fully corrupted stream, the residual kept);
    the head-space heads of a layer enter together, as Δz @ W_Oᵀ."""
    out: dict[str, Tensor] = {}
    b = c.shape[0]
    index = torch.arange(b, device=model.device)[:, None]
    every = [Receiver(kind, layer) for layer in range(model.n_layers) for kind in ("attn", "mlp")]
    heads = {layer: _heads_write(model, layer, z) for layer, z in dz.items()}
    for r in [*every, Receiver.reward()]:
        at = read_depth(model, r)
        k = depth[at]
        line = torch.zeros(b, t, model.d_model, device=model.device)
        where = (index.expand_as(c), c)  # accumulate: a short row repeats its last column (masked, Δ = 0)
        for j, s in enumerate(dsp):
            if write_depth(model, ups[s]) <= at:
                line.index_put_(where, deltas[j, k].to(line.device), accumulate=True)
        for layer, w in heads.items():
            if write_depth(model, Site.attn(layer)) <= at:
                line.index_put_(where, w.to(line.device), accumulate=True)
        out[r.name] = line
    return out
