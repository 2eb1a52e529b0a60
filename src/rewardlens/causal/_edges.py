"""`edges`: a score for every edge (upstream part → later node's input) from one forward and backward.

Edge attribution patching (EAP, Syed et al. 2023): the path-patching effect of sender u through
receiver d is, to first order, `−Σ_t Δ_u,t · ∂r/∂(input_d)_t` on the patched side (`Δ_u` as
`path_patch` defines it, the gradient from `node_grads` below), signed as `patch`'s margin
effect (clean margin − patched margin). EAP-IG (Hanna et al. 2024) averages the gradient over `steps`
points `α = k/steps`, k = 0..steps−1, on the line from the clean to the corrupted run in which every
node reads `x + α Σ_{u before it} Δ_u`: the upstream parts' writes are interpolated at the patched
columns, not the embeddings (`_lines`; steps=1 is EAP). The edges into 'reward' are not estimated: they
are path patching's direct effect, exactly (`_path.reward_path_rewards`, no forward); `verify=n`
path-patches the first n estimated ones (`_verify_edges`). A head upstream is scored in head
space, `Δz_h · (W_O[:, h]ᵀ g)` (`head_space`), so no head's Δ is held in d-space. Per batch of targets
the clean gradient pass also records the targets' activations and final residual, so only the sources
are traced beforehand (docs/circuits.md, Cost).

The gradients (`node_grads`), ∂r/∂(input of every node) from one forward and one backward: each sublayer
receiver d gets a zero leaf δ_d [B, T, d] through `_receivers.receiving` (δ added upstream of the node and
cancelled at its write), so `∂r/∂δ_d` is the gradient of the reward through node d's input alone, every
later path open (no graph is cut: the leaves are zeros). A head receiver
(l, h, x ∈ q/k/v) gets a zero leaf ε on each projection's output; `W_x[h]ᵀ ∂r/∂ε[h]` is the gradient at
the projection's input through head h's x alone, pulled back through the module between the stream and
the projections (the input norm; nothing in an encoder) by one vector-Jacobian product against the
attention receiver's leaf, whose only route to the projections' input is that module. The user's
parameters collect no `.grad` (`torch.autograd.grad` on the leaves only). The heads' gradients are
made one layer at a time, on demand (`NodeGrads.heads`), and scored as they come (`chunk_scores`),
so at most one layer's [B, n_x·H, m, d] of them is alive, never all D node inputs' [B, D, m, d].
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor, nn

from ..data import Inputs, Pair, effect, margin, pair_ids, pair_of
from ..data.internal import counting
from ..errors import CircuitError, UsageError
from ..model import RewardModel, TraceKey
from ..model.internal import Batch, Tokenized, capture, collate, each_batch, eval_mode, out_projection, rewriting
from ..plotting import HtmlView
from ..stats import rank_agreement, top_parts
from ..types import Ablation, Mode, Positions, Spans
from ._edge_nodes import Level, check_model, nodes
from ._engine import Site, head_write, site_point
from ._path import PathPatching, delta_keys, path_deltas, reward_path_rewards
from ._plan import Clean, PatchPlan, pair_seqs, sources_only
from ._receivers import QKVS, Receiver, read_depth, receiving, wiring, write_depth
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


def _leaf(store: dict[str, Tensor], key: str, x: Tensor) -> Tensor:
    leaf = torch.zeros_like(x, requires_grad=True)
    store[key] = leaf
    return x + leaf


def _keep(store: dict[str, Tensor], key: str, x: Tensor) -> None:
    store[key] = x


def _projections(model: RewardModel, layer: int) -> dict[str, nn.Module]:
    arch = model.arch
    paths = {"q": arch.attn_q, "k": arch.attn_k, "v": arch.attn_v}
    return {x: model.layer_module(layer, str(paths[x])) for x in QKVS}


@contextlib.contextmanager
def _leaves(model: RewardModel, b: int, t: int, heads: bool, base: dict[str, Tensor] | None,
            ) -> Iterator[tuple[dict[str, Tensor], dict[str, Tensor]]]:
    """Zero leaves on every sublayer receiver (each added to its `base` input shift, if any) and, with
    `heads`, every projection's output; yields (leaves, the projections' inputs as computed)."""
    leaves: dict[str, Tensor] = {}
    inputs: dict[str, Tensor] = {}
    dtype = next(model.model.parameters()).dtype
    hooks: list[tuple[nn.Module, str, Callable[[Tensor], Tensor | None]]] = []
    if heads:
        for layer in range(model.n_layers):
            for x, module in _projections(model, layer).items():
                key = f"{layer}{x}"
                hooks += [(module, "in", functools.partial(_keep, inputs, key)),
                          (module, "out", functools.partial(_leaf, leaves, key))]
    with contextlib.ExitStack() as stack:
        for layer in range(model.n_layers):
            for kind in ("attn", "mlp"):
                r = Receiver(kind, layer)
                leaves[r.name] = torch.zeros(b, t, model.d_model, device=model.device, dtype=dtype,
                                             requires_grad=True)
                shift = leaves[r.name] if base is None else base[r.name].to(dtype) + leaves[r.name]
                stack.enter_context(receiving(model, wiring(model, r), shift))
        if base is not None:  # the read-out on the same line
            stack.enter_context(receiving(model, wiring(model, Receiver.reward()), base["reward"]))
        stack.enter_context(rewriting(hooks))
        yield leaves, inputs


@dataclass(frozen=True)
class NodeGrads:
    """One gradient pass. `grad` [B, len(rows), m, d] fp32: the receivers `recvs[rows]` that are not
    heads (zeros for 'reward'); `layers`: per layer with head receivers, their indices in `recvs` and a
    function giving their gradients [B, n, m, d] fp32 on demand, so that one layer's head gradients are
    alive at a time, never all D of them (the pass's graph lives as long as this result). On a clean pass
    (no `base`) also the activations asked for at the columns (`act`, key → [B, m, w] fp32, as
    `capture_columns` gives them) and the final residual at the read token (`final` [B, d] fp32): the
    leaves are zeros, so these are the clean run's own values and no separate capture forward is needed."""

    grad: Tensor
    rows: tuple[int, ...]
    layers: tuple[tuple[tuple[int, ...], Callable[[], Tensor]], ...]
    act: dict[TraceKey, Tensor]
    final: Tensor

    def heads(self) -> Iterator[tuple[list[int], Tensor]]:
        """(indices in `recvs`, their gradients [B, n, m, d]) of the head receivers, layer by layer."""
        for index, grads in self.layers:
            yield list(index), grads()


def node_grads(model: RewardModel, batch: Batch, coef: Tensor, recvs: list[Receiver], cols: Tensor,
               base: dict[str, Tensor] | None, keys: Mapping[TraceKey, Site] | None = None) -> NodeGrads:
    """∂r/∂(input of each receiver) at columns `cols` [B, m], in fp32 (`NodeGrads`: the heads' per layer).

    `coef` [B, k]: the clean readout coefficients (a gate held clean); `base` (EAP-IG's point on the
    line to the corrupted run) maps each sublayer receiver's name and 'reward' to the shift [B, T, d]
    its input gets, or None (the clean run); `keys`: sites whose activations to record at `cols`."""
    b, t = batch.input_ids.shape
    heads = any(r.kind == "head" for r in recvs)
    final = model.final_points(batch, gate=False)[TraceKey.final()]
    kept: dict[str, Tensor] = {}
    read = [(final.module, final.where, functools.partial(_keep, kept, "final"))]
    c = cols.to(model.device)
    points = {k: site_point(model, site, c) for k, site in (keys or {}).items()}
    with torch.enable_grad(), eval_mode(model.model), _leaves(model, b, t, heads, base) as (leaves, inputs):
        with rewriting(read), capture(points, model.device) as act:
            model.backbone(**model.batch_kwargs(batch))
        rows = torch.arange(b, device=kept["final"].device)
        h = kept["final"][rows, batch.read_index.to(rows.device)].float().to(model.device)
        reward = (model.head_values(model.final_hidden(h)) * coef).sum()
        names = list(leaves)
        got = dict(zip(names, torch.autograd.grad(reward, [leaves[k] for k in names], retain_graph=heads,
                                                  allow_unused=True)))
    sub = tuple(k for k, r in enumerate(recvs) if r.kind != "head")
    out = torch.zeros(b, len(sub), c.shape[1], model.d_model, device=model.device)
    for j, k in enumerate(sub):
        g = got.get(recvs[k].name) if recvs[k].kind != "reward" else None
        if g is not None:
            out[:, j] = _at(g, c)
    by_layer: dict[int, list[int]] = {}
    for k, r in enumerate(recvs):
        if r.kind == "head":
            by_layer.setdefault(r.layer, []).append(k)
    layers = tuple((tuple(ks), functools.partial(_layer_grads, model, [recvs[k] for k in ks], got, leaves, inputs, c))
                   for _, ks in sorted(by_layer.items()))
    return NodeGrads(out, sub, layers, act, h.detach())


def _at(g: Tensor, cols: Tensor) -> Tensor:
    """g [B, T, d] at columns `cols` [B, m]: [B, m, d] fp32."""
    return g[torch.arange(g.shape[0], device=g.device)[:, None], cols].float()


def _layer_grads(model: RewardModel, recvs: list[Receiver], got: Mapping[str, Tensor | None],
                 leaves: dict[str, Tensor], inputs: dict[str, Tensor], cols: Tensor) -> Tensor:
    """The gradients [B, n, m, d] fp32 of one layer's head receivers `recvs` at columns `cols` [B, m]
    (zeros where a head's inputs do not reach the reward), one head's VJP at a time."""
    out = torch.zeros(cols.shape[0], len(recvs), cols.shape[1], model.d_model, device=model.device)
    for k, r in enumerate(recvs):
        g = _head_grad(model, r, got, leaves, inputs)
        if g is not None:
            out[:, k] = _at(g, cols)
    return out


def _head_grad(model: RewardModel, r: Receiver, got: Mapping[str, Tensor | None], leaves: dict[str, Tensor],
               inputs: dict[str, Tensor]) -> Tensor | None:
    """The gradient at the residual through head r.head's chosen inputs alone: per input x, the head's
    columns of ∂r/∂(x projection) through its weight, then back through the input module (one VJP)."""
    assert r.head is not None  # a head receiver
    wiring(model, r)  # refuses what path patching refuses: fused qkv, grouped k/v, a q/k norm over all heads
    size = _weight(_projections(model, r.layer)["q"]).shape[0] // model.n_heads
    cols = slice(r.head * size, (r.head + 1) * size)
    total: Tensor | None = None
    for x, module in _projections(model, r.layer).items():
        g = got[f"{r.layer}{x}"]
        if x not in r.inputs or g is None:
            continue
        back = g[..., cols] @ _weight(module)[cols].to(g.dtype)  # [B, T, d_in]
        pulled = torch.autograd.grad(inputs[f"{r.layer}{x}"], leaves[Receiver("attn", r.layer).name],
                                     grad_outputs=back.to(inputs[f"{r.layer}{x}"].dtype), retain_graph=True)[0]
        total = pulled if total is None else total + pulled
    return total


def _weight(module: nn.Module) -> Tensor:
    """A projection's weight [out, in] (nn.Linear's layout; fused Conv1D projections are refused before)."""
    weight = module.weight
    assert isinstance(weight, Tensor)
    return weight


def chunk_scores(model: RewardModel, ups: list[Site], dsp: list[int], zs: list[int],
                 deltas: dict[tuple[int, int], Tensor], dz: dict[int, Tensor], index: list[int],
                 grad: Tensor) -> Tensor:
    """First-order reward changes [B, U, n] into the downstream nodes `index` (their g [B, n, m, d]):
    Δ[b, u, m·d] @ g[b, n, m·d]ᵀ for the d-space parts, and Σ_{m,i} Δz_h[b, m, i] · (W_O[:, h]ᵀ g)[b, n, m, i]
    for the head-space heads (one W_O product per layer)."""
    b, n_down = grad.shape[0], grad.shape[1]
    out = torch.zeros(b, len(ups), n_down, device=grad.device)
    g = grad.flatten(2)  # [b, n, m·d]
    if dsp and all(deltas[s, k] is deltas[s, index[0]] for s in range(len(dsp)) for k in index):
        d = torch.stack([deltas[s, index[0]] for s in range(len(dsp))], 1).flatten(2)  # [b, U', m·d]
        out[:, dsp] = torch.bmm(d.to(g.device), g.transpose(1, 2))
    elif dsp:  # a post-norm encoder: δ carried to each receiver's depth
        for j, kk in enumerate(index):
            d = torch.stack([deltas[s, kk] for s in range(len(dsp))], 1).flatten(2)
            out[:, dsp, j] = torch.bmm(d.to(g.device), g[:, j, :, None])[..., 0]
    for layer, z in dz.items():
        weight, _ = out_projection(model, "attn", layer)  # [d, H·d_head]
        gz = (grad @ weight.to(grad.device)).view(*grad.shape[:3], model.n_heads, -1)  # [b, n, m, H, d_head]
        per_head = torch.einsum("bmhi,bkmhi->bhk", z.view(*z.shape[:2], model.n_heads, -1).to(gz.device), gz)
        for s in zs:
            if ups[s].layer == layer:
                out[:, s] = per_head[:, ups[s].head]
    return out
