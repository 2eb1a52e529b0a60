"""`path_patch`: the effect of a sender's patch that reaches the reward only through a receiver's input.

For sender s (embeddings, a sublayer or a head) and target sequence x, `patch`'s plan (mode, ablation,
positions) gives s a corrupted activation; `Δ_s` [T, d] is the change that makes in what s writes to the
residual (nonzero only at the patched positions). With every other part frozen at its clean value, the
stream a later receiver reads is `x_R + δ`, δ = Δ_s in pre-norm and parallel layouts (a sum of parts),
and `Δ_s` carried through the residual norms with the parts between held clean in a post-norm encoder.
The receiver alone reads `x_R + δ` (`_receivers.receiving`; every other node reads the clean stream),
and the model's own layers run on from the receiver's layer, so its changed output flows to the reward
(Wang et al., 2022). Receiver 'reward' adds δ to the final residual and reads the head: path-frozen
(`estimand="direct"`) patching. `effect = clean margin − patched margin`, as `patch`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs, Pair, chosen, pair_ids, rejected
from ..data.internal import counting
from ..errors import CircuitError
from ..model import RewardModel, SublayerKind, TraceKey
from ..model.internal import (
    Recording,
    Tokenized,
    capture,
    collate,
    each_batch,
    stepped_readout,
    stepping_works,
    unambiguous,
)
from ..plotting import HtmlView
from ..stats import top_parts
from ..types import Ablation, Mode, Positions, Spans
from ._direct import post_normed
from ._engine import Site, head_write
from ._margins import PatchedMargins
from ._plan import Clean, PatchPlan, capture_columns, pair_seqs
from ._receivers import Receiver, Wiring, clean_points, read_depth, receiving, wiring, write_depth
from ._registry import Provenance
from ._spec import PatchSpec, spec_of

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class PathPatching(HtmlView, PatchedMargins):
    """Rewards of every pair with each sender's patch reaching the reward only through each receiver.

    `chosen`, `rejected` [n]: clean rewards; `patched_chosen`, `patched_rejected` [n, S, R]: the
    rewards with sender s's change given to receiver r's input alone (the clean reward on a side
    the mode leaves alone)."""

    _html_top_names = ("sender", "receiver", "mean effect")

    senders: list[str]
    receivers: list[str]
    chosen: np.ndarray
    rejected: np.ndarray
    patched_chosen: np.ndarray
    patched_rejected: np.ndarray
    mode: Mode
    positions: Positions | Literal["spans"]
    pair_ids: list[str]
    min_margin: float = 1e-4

    @property
    def provenance(self) -> Provenance:
        """How the numbers were computed: path patching's one method (its own engine, not `patch`'s registry)."""
        return Provenance("path_patch", proof="each batch steps from its layers where stepping reproduces the "
                          "model's forward, else full forwards")

    @property
    def edges(self) -> list[tuple[str, str]]:
        """Every (sender, receiver), in the row-major order of the effect's last two axes."""
        return [(s, r) for s in self.senders for r in self.receivers]

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The `k` (sender, receiver) paths of largest mean |effect| over pairs, with the signed mean
        effect (the ranking rule of `stats.top_parts`)."""
        flat = self.effect.reshape(self.effect.shape[0], -1)
        mean = flat.mean(0)
        return [(*self.edges[i], float(mean[i])) for i in top_parts(flat, k)]

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (pair, sender, receiver) with effect and normalised effect."""
        import pandas as pd

        n, s, r = self.effect.shape
        return pd.DataFrame({
            "pair": np.repeat(self.pair_ids, s * r), "sender": np.tile(np.repeat(self.senders, r), n),
            "receiver": np.tile(self.receivers, n * s), "effect": self.effect.ravel(),
            "normalized": self.normalized.ravel(), "patched_chosen": self.patched_chosen.ravel(),
            "patched_rejected": self.patched_rejected.ravel(),
        })

    def plot(self, n: int = 20, ax: Axes | None = None) -> Figure:
        """Bar chart of the mean effect of the top `n` paths, into `ax` when given (its figure is
        returned), else a new figure."""
        from ..plotting import finish, one_panel

        top = self.top(n)
        ax, made = one_panel(ax, (6, 0.3 * len(top) + 1))
        ax.barh([f"{s} → {r}" for s, r, _ in top][::-1], [e for _, _, e in top][::-1])
        ax.set_xlabel(f"mean path-patching effect on the margin ({self.mode}, {self.positions} positions)")
        return finish(ax, made)


def path_patch(
    model: RewardModel,
    pairs: Sequence[Pair],
    *,
    senders: Sequence[str],
    receivers: Sequence[str],
    mode: Mode | None = None,
    ablation: Ablation = "zero",
    positions: Positions | Spans = "read",
    reference: Inputs | None = None,
    batch_size: int = 8,
    min_margin: float = 1e-4,
    spec: PatchSpec | None = None,
    progress: bool = False,
) -> PathPatching:
    """Path-patch every (sender, receiver) of every pair (docs/circuits.md).

    `senders`: part names ('embed', 'attn_L3', 'mlp_L2', 'attn_L3_H1'); `receivers`: 'attn_L3', 'mlp_L2',
    'attn_L3_H1' (the head's query, key and value inputs), 'attn_L3_H1_q' (or _k, _v) or 'reward'. Every
    receiver must read at or after every sender (`CircuitError` otherwise). `mode`, `ablation`, `positions`,
    `reference` and `spec` (whose level and estimand are not used: the senders and receivers say them) are
    `patch`'s: the sender's corrupted activation is exactly the one `patch` would insert.
    """
    with counting("path_patch", progress):
        if model.reads.multi:
            raise CircuitError("path_patch reads the reward at one token; this model reads it at a set of positions "
                               "(PRM steps, DPO tokens): use rl.patch, which patches at every read")
        given = (mode or "noising") if spec is None else mode  # spec_of refuses a keyword that disagrees with spec
        spec = spec_of(spec, mode=given, ablation=ablation, positions=positions)
        sites, recvs = _parse(model, senders, receivers)
        wires = {r: wiring(model, r) for r in recvs if r.kind != "reward"}
        seqs = pair_seqs(model, pairs, None)
        clean = Clean.run(model, seqs, heads=any(s.head is not None for s in sites), batch_size=batch_size)
        ref = None if reference is None else model.encode(reference)[0]
        plan = PatchPlan.make(model, clean, sites, spec.mode, spec.ablation, spec.positions, ref, batch_size,
                              ids=pair_ids(pairs))
        cols, valid, values = plan.at_columns(clean)
        deltas = path_deltas(model, clean, plan.targets, cols, valid, values, sites, recvs, batch_size)
        out = torch.zeros(len(plan.targets), len(sites), len(recvs), device=model.device)
        for k, r in enumerate(recvs):
            if r.kind == "reward":
                out[:, :, k] = reward_path_rewards(model, clean, plan.targets, cols, deltas, len(sites), k)
        if wires:
            _stepped_rewards(model, seqs, plan.targets, cols, deltas, sites, recvs, wires, batch_size, out)
        rows = clean.reward[:, None, None].repeat(1, len(sites), len(recvs))
        rows[plan.targets] = out.to(rows.dtype)
        patched, reward = rows.cpu().numpy(), clean.reward.cpu().numpy()
        return PathPatching(
            senders=[s.name for s in sites], receivers=[r.name for r in recvs], chosen=chosen(reward),
            rejected=rejected(reward), patched_chosen=chosen(patched), patched_rejected=rejected(patched),
            mode=spec.mode, positions=spec.positions if isinstance(spec.positions, str) else "spans",
            pair_ids=pair_ids(pairs), min_margin=min_margin)


def _parse(model: RewardModel, senders: Sequence[str], receivers: Sequence[str]) -> tuple[list[Site], list[Receiver]]:
    """The senders as sites and the receivers, validated; every receiver must read after every sender."""
    if isinstance(senders, str) or isinstance(receivers, str) or not senders or not receivers:
        raise CircuitError(f"path_patch needs non-empty lists of senders and receivers, got senders={senders!r}, "
                           f"receivers={receivers!r}; e.g. senders=['attn_L0'], receivers=['mlp_L1', 'reward']")
    sites = [Site.parse(str(s)) for s in senders]
    for site in sites:
        if not (site.is_sublayer or site.head is not None) or site.layer >= model.n_layers or (
                site.head is not None and site.head >= model.n_heads):
            raise CircuitError(f"sender {site.name!r} is not a patchable part of this model ({model.n_layers} "
                               f"layers, {model.n_heads} heads): senders are 'embed', sublayers and heads")
    recvs = [Receiver.parse(str(r)) for r in receivers]
    for site in sites:
        for r in recvs:
            if read_depth(model, r) < write_depth(model, site):
                raise CircuitError(
                    f"receiver {r.name!r} reads the residual stream before sender {site.name!r} writes to it "
                    f"({model.arch.layout} layout), so no path joins them; pick a receiver in a later layer "
                    "(or 'reward') or an earlier sender")
    return sites, recvs


def delta_keys(model: RewardModel, sites: list[Site]) -> dict[TraceKey, Site]:
    """What `path_deltas` reads at the patched columns: each sender's activation, a head's sublayer output,
    and in a post-norm encoder every part (the residual norms are recomputed from them)."""
    keys: dict[TraceKey, Site] = {s.key: s for s in sites}
    keys.update({TraceKey.sublayer("attn", s.layer): Site.attn(s.layer) for s in sites if s.head is not None})
    if model.arch.layout == "post_norm" and model.arch.attn_post_norm is None:
        keys[TraceKey.embed()] = Site.embed()
        for layer in range(model.n_layers):
            keys.update({TraceKey.sublayer("attn", layer): Site.attn(layer),
                         TraceKey.sublayer("mlp", layer): Site.mlp(layer)})
    return keys


def _write_change(model: RewardModel, act: dict[TraceKey, Tensor], site: Site, value: Tensor) -> Tensor:
    """Δ [n, m, d]: what the site's corrupted activation `value` ([w] or [n, m, w]) changes in what it
    writes to the residual at the patched columns (through its own post-norm, where it has one)."""
    old = act[site.key]
    new = value.to(old.device).expand_as(old) if value.ndim == 1 else value.to(old.device)
    if site.kind == "embed":
        return new - old
    raw = act[TraceKey.sublayer(site.kind, site.layer)]
    if site.head is not None:
        new = raw + head_write(model, site, new - old)
    return post_normed(model, site.kind, site.layer, new) - post_normed(model, site.kind, site.layer, raw)


def _carry(model: RewardModel, act: dict[TraceKey, Tensor], site: Site, change: Tensor, depth: int) -> Tensor:
    """δ [n, m, d] the stream carries at half-layer `depth`: the change itself in a sum of parts, else (a
    post-norm encoder) the residual norms recomputed on it with every other part frozen."""
    arch = model.arch
    if arch.layout != "post_norm" or arch.attn_post_norm is not None:
        return change
    start = write_depth(model, site)
    x = act[TraceKey.embed()]
    moved = x + change if start == 0 else x
    for step in range(1, depth + 1):
        kind: SublayerKind = "attn" if step % 2 else "mlp"
        layer = (step - 1) // 2
        norm = model.norm(arch.residual_norms[0 if kind == "attn" else 1], layer)
        part = act[TraceKey.sublayer(kind, layer)]
        x, moved = norm(x + part), norm(moved + part + (change if step == start else 0))
    return moved - x


def path_deltas(
    model: RewardModel, clean: Clean, targets: list[int], cols: Tensor, valid: Tensor,
    values: dict[TraceKey, Tensor], sites: list[Site], recvs: list[Receiver], batch_size: int,
    act: dict[TraceKey, Tensor] | None = None,
) -> dict[tuple[int, int], Tensor]:
    """(sender, receiver) → δ [n_targets, m, d] in fp32 at the patched columns (zero where not valid).
    `act`: the targets' `delta_keys` activations at `cols` where the caller captured them in a forward
    of its own (edge attribution's gradient pass), else one capture forward here."""
    if act is None:
        act = capture_columns(model, clean.seqs, targets, cols, delta_keys(model, sites), batch_size)
    keep = valid.to(model.device)[..., None]
    out: dict[tuple[int, int], Tensor] = {}
    for s, site in enumerate(sites):
        change = _write_change(model, act, site, values[site.key]) * keep
        for k, r in enumerate(recvs):
            # A sum of parts carries `change` itself: every receiver shares the sender's one tensor.
            out[s, k] = _carry(model, act, site, change, read_depth(model, r))
    return out


def reward_path_rewards(model: RewardModel, clean: Clean, targets: list[int], cols: Tensor,
               deltas: dict[tuple[int, int], Tensor], n_senders: int, k: int) -> Tensor:
    """Rewards [n_targets, S] with δ added to the final residual at the read token and the readout (a
    gate too) clean: path-frozen patching, read off the clean trace with no forward."""
    index = torch.tensor(targets, device=model.device)
    read = torch.tensor([clean.read[i] for i in targets], device=model.device)
    hit = cols.to(model.device) == read[:, None]
    at, rows = hit.float().argmax(1), torch.arange(len(targets), device=model.device)
    final, coef = clean.captured[TraceKey.final()][index], clean.coef[index]
    out = []
    for s in range(n_senders):
        delta = deltas[s, k][rows, at] * hit.any(1)[:, None]
        out.append((model.head(model.final_hidden(final + delta)) * coef).sum(-1))
    return torch.stack(out, 1)


def _stepped_rewards(
    model: RewardModel, seqs: list[Tokenized], targets: list[int], cols: Tensor, deltas: dict[tuple[int, int], Tensor],
    sites: list[Site], recvs: list[Receiver], wires: dict[Receiver, Wiring], batch_size: int, out: Tensor,
) -> None:
    """Fill `out` [n_targets, S, R] for the layer receivers: per batch of targets one recorded clean
    forward (with the frozen modules' clean outputs at every position), then per receiver the model's
    own layers from the receiver's layer on, one row per (sender, target), the receiver rewired; full
    forwards of those rows where stepping does not reproduce the model's forward (`stepping_works`)."""
    position = {t: j for j, t in enumerate(targets)}

    def work(rows: list[int]) -> None:
        for group in unambiguous(seqs, rows):
            _batch(model, [seqs[i] for i in group], [position[i] for i in group], cols, deltas, sites, recvs,
                   wires, batch_size, out)

    # The rows are the sequences' own numbers already, so no `ids=` maps them (it would index by them).
    each_batch(sorted(targets, key=lambda i: len(seqs[i].ids)), batch_size, work, is_pairs=True,
               lengths=[len(s.ids) for s in seqs])  # a short target is not padded to a long one


def _batch(
    model: RewardModel, group: list[Tokenized], js: list[int], cols: Tensor, deltas: dict[tuple[int, int], Tensor],
    sites: list[Site], recvs: list[Receiver], wires: dict[Receiver, Wiring], size: int, out: Tensor,
) -> None:
    """One batch of targets (`group`, rows `js` of the plan): its recorded clean forward, then every
    (sender, receiver) row, `size` rows per call of the layers."""
    batch = collate(group, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
    b, t = batch.input_ids.shape
    every = torch.arange(t, device=model.device).expand(b, t)
    points = {(r, key): p for r, w in wires.items() for key, p in clean_points(w, every).items()}
    with capture(points, model.device) as held:
        rec = Recording(model, batch)
    stepped = stepping_works(model, rec)  # else every row runs whole (exact, slower)
    jobs = [(s, i) for s in range(len(sites)) for i in range(b)]
    for k, r in enumerate(recvs):
        if r.kind == "reward":
            continue
        for at in range(0, len(jobs), size):
            job = jobs[at: at + size]
            rows = torch.tensor([i for _, i in job])
            delta = torch.zeros(len(job), t, model.d_model, device=model.device)
            for n, (s, i) in enumerate(job):
                delta[n].index_add_(0, cols[js[i]].to(model.device), deltas[s, k][js[i]])  # padded columns add 0
            clean = {key: v[rows.to(v.device)] for (rk, key), v in held.items() if rk == r}
            if stepped:
                with receiving(model, wires[r], delta, clean):
                    reward = stepped_readout(model, rec, rec.run(model, r.layer, rows), rows)
            else:
                reward = _whole(model, [group[i] for i in rows.tolist()], wires[r], delta, clean)
            out[torch.tensor([js[i] for _, i in job]), torch.tensor([s for s, _ in job]), k] = reward.to(out.dtype)


def _whole(model: RewardModel, seqs: list[Tokenized], wire: Wiring, delta: Tensor, clean: dict[str, Tensor]) -> Tensor:
    """Rewards [r] of one full forward of `seqs` (a batch's rows, repeats allowed) with the receiver rewired:
    for a model whose layers cannot be stepped. Right padding keeps positions, so `delta` [r, T, d] and
    the clean outputs are cut to this batch's length."""
    batch = collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
    t = batch.input_ids.shape[1]
    with receiving(model, wire, delta[:, :t], {key: v[:, :t] for key, v in clean.items()}):
        values, coef = model.head_readout(model.run(batch, model.final_points(batch)))
    return (values * coef).sum(-1)


# The edge instruments (`_edges.py`) reuse these two steps of path patching as they are.
