"""`edges`: a score for every edge (upstream part → later node's input) from one forward and backward.

Edge attribution patching (EAP, Syed et al. 2023): the path-patching effect of sender u through
receiver d is, to first order, `−Σ_t Δ_u,t · ∂r/∂(input_d)_t` on the patched side (`Δ_u` as
`path_patch` defines it, the gradient from `_edge_grads.node_grads`), signed as `patch`'s margin
effect (clean margin − patched margin). EAP-IG (Hanna et al. 2024) averages the gradient over `steps`
points `α = k/steps`, k = 0..steps−1, on the line from the clean to the corrupted embeddings at the
patched columns (steps=1 is EAP). The edges into 'reward' are not estimated: they are path patching's
direct effect, exactly (`_path.reward_path_rewards`, no forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs, Pair, counting, pair_ids
from ..errors import ArchitectureError, CircuitError
from ..model import RewardModel
from ..model.internal import collate, each_batch
from ..stats import top_parts
from ..types import Ablation, Mode, Positions, Spans
from ._edge_grads import node_grads
from ._engine import Site
from ._path import path_deltas, reward_path_rewards
from ._plan import Clean, PatchPlan, pair_seqs
from ._receivers import QKV, QKVS, Receiver, read_depth, write_depth
from ._spec import PatchSpec, spec_of

if TYPE_CHECKING:
    import pandas as pd

Method = Literal["eap", "eap-ig"]
Level = Literal["sublayer", "head"]


@dataclass(frozen=True)
class Edges:
    """Edge scores [n_pairs, U, D]: upstream part u → downstream node input d, in reward units of the
    margin effect (clean − patched margin, as `patch`'s). NaN where d reads before u writes. The
    'reward' column is exact (`path_patch` to the read-out); the rest are first-order estimates."""

    upstream: list[str]
    downstream: list[str]
    score: np.ndarray
    margin: np.ndarray
    method: Method
    steps: int
    level: Level
    mode: Mode
    pair_ids: list[str]

    @property
    def approximate(self) -> np.ndarray:
        """[D] True where the column is a first-order estimate (every downstream node but 'reward')."""
        return np.array([d != "reward" for d in self.downstream])

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

    def to_frame(self) -> pd.DataFrame:
        """One row per (pair, existing edge): upstream, downstream, score, and whether it is estimated."""
        import pandas as pd

        flat, names = self.flat(), self.names
        n, e = flat.shape
        return pd.DataFrame({
            "pair": np.repeat(self.pair_ids, e), "upstream": np.tile([u for u, _ in names], n),
            "downstream": np.tile([d for _, d in names], n), "score": flat.ravel(),
            "approximate": np.tile([d != "reward" for _, d in names], n)})


def nodes(model: RewardModel, level: Level, qkv: bool) -> tuple[list[Site], list[Receiver]]:
    """Every upstream part (embeddings, then per layer attention or its heads, then the MLP) and every
    downstream node input (per layer attention, its heads or their q/k/v, the MLP, then 'reward')."""
    if level not in ("sublayer", "head"):
        raise ValueError(f"level must be 'sublayer' or 'head', got {level!r}")
    ups: list[Site] = [Site.embed()]
    downs: list[Receiver] = []
    inputs: tuple[QKV | None, ...] = QKVS if qkv else (None,)
    if level == "head" and _grouped(model):  # one key/value head serves several query heads: only q is a head's own
        inputs = ("q",)
    for layer in range(model.n_layers):
        if level == "head":
            ups += [Site.attn(layer, h) for h in range(model.n_heads)]
            downs += [Receiver("head", layer, h, x) for h in range(model.n_heads)
                      for x in inputs]
        else:
            ups.append(Site.attn(layer))
            downs.append(Receiver("attn", layer))
        ups.append(Site.mlp(layer))
        downs.append(Receiver("mlp", layer))
    return ups, [*downs, Receiver.reward()]


def _grouped(model: RewardModel) -> bool:
    """Whether the key projection is narrower than the query projection (grouped-query attention)."""
    q, k = model.arch.attn_q, model.arch.attn_k
    if q is None or k is None:
        return False
    wk, wq = model.layer_module(0, k).weight, model.layer_module(0, q).weight
    assert isinstance(wk, Tensor) and isinstance(wq, Tensor)
    return wk.shape[0] != wq.shape[0]


def check_model(model: RewardModel, what: str) -> None:
    """Edge instruments read the reward at one token of a sequential layout (one CircuitError/ArchitectureError)."""
    if model.reads.multi:
        raise CircuitError(f"{what} reads the reward at one token; this model reads it at a set of positions "
                           "(PRM steps, DPO tokens): use rl.patch, which patches at every read")
    if model.arch.layout == "parallel":
        raise ArchitectureError(f"{what}: map {model.arch.name!r} has a parallel layout (attention and MLP read "
                                "one input), so one sublayer's input cannot take a gradient alone; use rl.path_patch")


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
    progress: bool = False,
) -> Edges:
    """Score every edge of the model (docs/circuits.md): EAP (one forward and backward per batch of
    targets) or EAP-IG (`steps` of them). Corruption (`mode`, `ablation`, `positions`, `reference`,
    `spec`) is `patch`'s; `level='head'` scores heads (with `qkv`, each head's query, key and value
    inputs apart)."""
    if method not in ("eap", "eap-ig"):
        raise ValueError(f"method must be 'eap' or 'eap-ig', got {method!r}")
    if int(steps) < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    steps = 1 if method == "eap" else int(steps)
    with counting("edges", progress):
        check_model(model, "edges")
        spec = spec_of(spec, mode=(mode or "noising") if spec is None else mode, ablation=ablation,
                       positions=positions)
        ups, downs = nodes(model, level, qkv)
        seqs = pair_seqs(model, pairs, None)
        clean = Clean.run(model, seqs, heads=level == "head", batch_size=batch_size)
        ref = None if reference is None else model.encode(reference)[0]
        plan = PatchPlan.make(model, clean, ups, spec.mode, spec.ablation, spec.positions, ref, batch_size,
                              ids=pair_ids(pairs))
        cols, valid, values = plan.at_columns(clean)
        deltas = path_deltas(model, clean, plan.targets, cols, valid, values, ups, downs, batch_size)
        est = _estimate(model, seqs, clean, plan.targets, cols, deltas, ups, downs, steps, batch_size)
        est[:, :, -1] = reward_path_rewards(model, clean, plan.targets, cols, deltas, len(ups), len(downs) - 1) \
            - clean.reward[plan.targets][:, None]
        score = _per_pair(est, plan.targets, len(seqs) // 2)
        ok = np.array([[read_depth(model, d) >= write_depth(model, u) for d in downs] for u in ups])
        score[:, ~ok] = np.nan
        reward = clean.reward.cpu().numpy()
        return Edges([u.name for u in ups], [d.name for d in downs], score, reward[0::2] - reward[1::2], method,
                     steps, level, spec.mode, pair_ids(pairs))


def _per_pair(est: Tensor, targets: list[int], n_pairs: int) -> np.ndarray:
    """Margin effects [n_pairs, U, D] from reward changes [n_targets, U, D]: a chosen target's change
    lowers the margin (effect −Δr), a rejected one's raises it (+Δr)."""
    out = np.zeros((n_pairs, *est.shape[1:]))
    for j, t in enumerate(targets):
        out[t // 2] += (-1.0 if t % 2 == 0 else 1.0) * est[j].double().cpu().numpy()
    return out


def _estimate(model: RewardModel, seqs: list, clean: Clean, targets: list[int], cols: Tensor,
              deltas: dict[tuple[int, int], Tensor], ups: list[Site], downs: list[Receiver], steps: int,
              batch_size: int) -> Tensor:
    """First-order reward changes [n_targets, U, D]: Δ[j, u, m·d] @ g[j, d, m·d]ᵀ per target, the
    gradient averaged over the steps (never a [T, U, D, d] tensor)."""
    out = torch.zeros(len(targets), len(ups), len(downs), device=model.device)
    shared = all(deltas[s, k] is deltas[s, 0] for s in range(len(ups)) for k in range(len(downs)))
    depth = {read_depth(model, d): k for k, d in reversed(list(enumerate(downs)))}

    def work(rows: list[int]) -> None:
        index = [targets[j] for j in rows]
        batch = collate([seqs[i] for i in index], pad_id=model.pad_token_id, side="right", first=model.encoder,
                        device=model.device)
        b, t = batch.input_ids.shape
        c = cols[rows].to(model.device)
        grad = torch.zeros(b, len(downs), c.shape[1], model.d_model, device=model.device)
        lines = _lines(model, ups, deltas, depth, rows, c, t) if steps > 1 else {}
        for k in range(steps):
            base = {name: line * (k / steps) for name, line in lines.items()} if k else None
            grad += node_grads(model, batch, clean.coef[index], downs, c, base) / steps
        g = grad.flatten(2)  # [b, D, m·d]
        if shared:
            d = torch.stack([deltas[s, 0][rows] for s in range(len(ups))], 1).flatten(2)  # [b, U, m·d]
            out[rows] = torch.bmm(d.to(g.device), g.transpose(1, 2))
            return
        for kk in range(len(downs)):  # a post-norm encoder: δ carried to each receiver's depth
            d = torch.stack([deltas[s, kk][rows] for s in range(len(ups))], 1).flatten(2)
            out[rows, :, kk] = torch.bmm(d.to(g.device), g[:, kk, :, None])[..., 0]

    lengths = [len(seqs[i].ids) for i in targets]
    each_batch(sorted(range(len(targets)), key=lengths.__getitem__), batch_size, work, ids=targets, is_pairs=True,
               lengths=lengths)
    return out


def _lines(model: RewardModel, ups: list[Site], deltas: dict[tuple[int, int], Tensor], depth: dict[int, int],
           rows: list[int], c: Tensor, t: int) -> dict[str, Tensor]:
    """EAP-IG's direction [b, T, d] per sublayer receiver and 'reward': Σ_u Δ_u over every upstream part
    written before it reads (at α = 1 every node reads the fully corrupted stream, the residual kept)."""
    out: dict[str, Tensor] = {}
    index = torch.arange(len(rows), device=model.device)[:, None]
    every = [Receiver(kind, layer) for layer in range(model.n_layers) for kind in ("attn", "mlp")]
    for r in [*every, Receiver.reward()]:
        at = read_depth(model, r)
        k = depth[at]
        line = torch.zeros(len(rows), t, model.d_model, device=model.device)
        for s, u in enumerate(ups):
            if write_depth(model, u) <= at:
                line[index, c] += deltas[s, k][rows].to(line.device)
        out[r.name] = line
    return out
