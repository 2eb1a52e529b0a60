"""`circuit`: keep the top edges and measure how much of the clean margin they carry alone.

Edges are ranked by mean |score| over pairs (`stats.top_parts`). A circuit of the k first edges is
evaluated by edge ablation (`_circuit_run`): every edge outside it carries its upstream part's
corrupted write, and the faithfulness (`share`) is each pair's circuit margin against its own clean
margin, pooled with weights |m_i| (`stats.margin_share`: `Σ sign(m_i)·m_i(C) / Σ |m_i|`; 1 for every
edge; `empty` is the margin with no edge kept), which pairs whose margins disagree in sign cannot send
through a near-zero denominator. The ratio of means `mean margin(C) / mean clean margin` is kept as
`share_of_mean_margin`, and `warning` (`stats.share_warning`) says when it is ill-conditioned. The curve
runs over circuit sizes. Sublayer or head level
(heads as parts, each head's input, or its q/k/v inputs apart, as nodes), as the edges were scored.
With `verify=n` the cheap scores only propose: the estimated edges among the first n are path-patched
(`Edges.verify`) and the ranking is by those exact scores; `exact` marks, per ranked edge, which are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..data import Inputs, Pair
from ..data.internal import counting
from ..errors import ArchitectureError, CircuitError, UsageError
from ..model import RewardModel
from ..model.internal import collate, each_batch
from ..stats import margin_share, mean_abs, share_warning, to_json, top_parts
from ..types import Ablation, Mode, Positions, Spans
from ._circuit_run import check_heads, circuit_rewards, corrupted_writes
from ._edge_nodes import Level, check_model, nodes
from ._edges import Edges, Method
from ._edges import edges as edge_scores
from ._engine import Site
from ._plan import Clean, PatchPlan, pair_seqs
from ._receivers import Receiver
from ._verify_edges import check_verify

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Circuit:
    """A circuit (`kept`: edges (upstream, downstream, mean score), best first) and its curve: `sizes`
    [S] circuits of the first k ranked edges with margins `margins` [S, n_pairs]; `clean` and `empty`
    [n_pairs] the margins with every edge and with none. `exact` [len(ranked)]: whether each ranked
    edge's score is exact (into 'reward', or path-patched: `verified` of them), not a first-order estimate.
    `mean_abs` [len(ranked)]: each ranked edge's mean |score| over pairs, the statistic it is ranked by
    (`stats.top_parts`; empty on a result made before it was kept)."""

    kept: list[tuple[str, str, float]]
    ranked: list[tuple[str, str, float]]
    sizes: list[int]
    margins: np.ndarray
    clean: np.ndarray
    empty: np.ndarray
    method: str
    mode: str
    level: str = "sublayer"
    exact: list[bool] = field(default_factory=list)
    verified: int = 0
    mean_abs: list[float] = field(default_factory=list)

    @property
    def shares(self) -> np.ndarray:
        """Faithfulness [S]: each pair's circuit margin against its own clean margin, |margin|-weighted
        (`stats.margin_share`: `Σ_i sign(m_i)·m_i(C) / Σ_i |m_i|`); NaN when every margin is near zero."""
        return margin_share(self.margins.T, self.clean)

    @property
    def pair_shares(self) -> np.ndarray:
        """Per pair [S, n_pairs]: circuit margin / clean margin (NaN where |clean margin| < 1e-4)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out = self.margins / self.clean
        return np.where(np.abs(self.clean) < 1e-4, np.nan, out)

    @property
    def shares_of_mean_margin(self) -> np.ndarray:
        """[S] mean circuit margin / mean clean margin: ill-conditioned when the pairs disagree (`warning`)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.margins.mean(1) / self.clean.mean()

    @property
    def share(self) -> float:
        """Faithfulness of the kept circuit (`shares`)."""
        return float(self.shares[self.sizes.index(len(self.kept))])

    @property
    def share_of_mean_margin(self) -> float:
        """The kept circuit's mean margin / mean clean margin (`shares_of_mean_margin`)."""
        return float(self.shares_of_mean_margin[self.sizes.index(len(self.kept))])

    @property
    def warning(self) -> str | None:
        """One line when the share of the mean margin is ill-conditioned on these pairs (`stats.share_warning`)."""
        return share_warning(self.clean)

    def smallest(self, target: float) -> list[tuple[str, str, float]]:
        """The smallest evaluated circuit whose faithfulness reaches `target`; CircuitError otherwise."""
        hit = [k for k, s in zip(self.sizes, self.shares) if s >= target]
        if not hit:
            raise CircuitError(f"no evaluated circuit reaches a share of {target:g} of the clean margins (best "
                               f"{np.nanmax(self.shares):.3g} at {self.sizes[int(np.nanargmax(self.shares))]} edges); "
                               "lower the target or evaluate larger circuits (sizes=)")
        return self.ranked[:min(hit)]

    def to_frame(self) -> pd.DataFrame:
        """One row per circuit size: edges kept, mean margin, faithfulness (`share`) and the ratio of means."""
        import pandas as pd

        return pd.DataFrame({"edges": self.sizes, "margin": self.margins.mean(1), "share": self.shares,
                             "share_of_mean_margin": self.shares_of_mean_margin})

    def to_json(self) -> str:
        return to_json(self.summary())

    def summary(self) -> dict[str, Any]:
        exact = self.exact or [d == "reward" for _, d, _ in self.ranked]  # a result made before `exact` existed
        size = self.mean_abs or [float("nan")] * len(self.ranked)  # a result made before `mean_abs` was kept
        return {"method": self.method, "mode": self.mode, "level": self.level, "share": self.share,
                "share_of_mean_margin": self.share_of_mean_margin, "warning": self.warning,
                "verified": self.verified,
                "kept": [{"upstream": u, "downstream": d, "mean_abs_score": a, "score": s, "exact": bool(x)}
                         for (u, d, s), a, x in zip(self.kept, size, exact)],
                "curve": [{"edges": k, "share": float(s), "share_of_mean_margin": float(o)}
                          for k, s, o in zip(self.sizes, self.shares, self.shares_of_mean_margin)],
                "clean_margin": float(self.clean.mean()), "mean_abs_clean_margin": float(np.abs(self.clean).mean()),
                "empty_margin": float(self.empty.mean())}

    def plot(self, ax: Axes | None = None) -> Figure:
        """The kept circuit as a layered graph: parts by depth, edges by width (|score|) and colour
        (sign), the read-out on top."""
        from ..plotting import finish, one_panel

        ax, made = one_panel(ax, (6, 6))
        names = sorted({n for u, d, _ in self.kept for n in (u, d)}, key=_depth)
        at = {n: (i % 4 + 0.3 * (_depth(n) % 2), _depth(n)) for i, n in enumerate(names)}
        big = max((abs(s) for *_, s in self.kept), default=1.0) or 1.0
        for u, d, s in self.kept:
            (x0, y0), (x1, y1) = at[u], at[d]
            ax.plot([x0, x1], [y0, y1], color="tab:blue" if s > 0 else "tab:red", lw=0.5 + 4 * abs(s) / big)
        for n, (x, y) in at.items():
            ax.annotate(n, (x, y), ha="center", fontsize=8, bbox={"boxstyle": "round", "fc": "white"})
        ax.set_ylabel("depth (half-layers; the read-out on top)")
        ax.set_xticks([])
        ax.set_title(f"circuit of {len(self.kept)} edges: {self.share:.0%} of each pair's clean margin")
        return finish(ax, made)


def _depth(name: str) -> float:
    """Plot height of a part: its layer, the MLP half a layer up, 'reward' above everything."""
    if name == "reward":
        return 1e3
    if name == "embed":
        return -1
    layer = int(name.split("_L")[1].split("_")[0])
    return layer + (0.5 if name.startswith("mlp") else 0)


def circuit(
    model: RewardModel,
    pairs: Sequence[Pair],
    *,
    edges: Edges | None = None,
    top: int | None = None,
    share: float | None = None,
    sizes: Sequence[int] | None = None,
    method: Method = "eap-ig",
    steps: int = 5,
    level: Level = "sublayer",
    qkv: bool = False,
    mode: Mode | None = None,
    ablation: Ablation = "zero",
    positions: Positions | Spans = "read",
    reference: Inputs | None = None,
    batch_size: int = 8,
    verify: int | None = None,
    progress: bool = False,
) -> Circuit:
    """Rank every edge (`edges`, else `rl.edges` with `method`, `level` and `qkv`), keep the `top` first
    (or the fewest whose mean |score| reaches `share` of the total), and evaluate circuits of `sizes`
    edges (default: doubling up to every edge, and the kept one) by edge ablation, all of its nodes
    (heads and their q/k/v inputs at `level='head'`) in one forward per batch and size. `verify=n`:
    rank by exact scores, the estimated edges among the first n path-patched (`Edges.verify`, this
    corruption) until the first n are all exact."""
    n_verify = check_verify(verify)
    with counting("circuit", progress):
        check_model(model, "circuit")
        if model.arch.layout == "post_norm" and model.arch.attn_post_norm is None:
            raise ArchitectureError("circuit: a post-norm encoder renormalises the stream after every sublayer, so "
                                    "edge ablation is not a sum of writes; use rl.edges and rl.path_patch")
        if (edges.level if edges is not None else level) == "head":
            check_heads(model)
        if edges is None:
            edges = edge_scores(model, pairs, method=method, steps=steps, level=level, qkv=qkv, mode=mode,
                                ablation=ablation, positions=positions, reference=reference, batch_size=batch_size)
        if n_verify:
            edges = edges.verify(model, pairs, n_verify, ablation=ablation, positions=positions, reference=reference,
                                 batch_size=batch_size)
        flat, names, exact = edges.flat(), edges.names, edges.exact[edges.valid]
        order = top_parts(flat)
        ranked = [(*names[i], float(flat[:, i].mean())) for i in order]
        size = mean_abs(flat)
        n_keep = _how_many(flat[:, order], top, share)
        want = sorted({*(sizes or _doubling(len(ranked))), n_keep, 0, len(ranked)})
        ups, downs = _nodes(model, edges)
        seqs = pair_seqs(model, pairs, None)
        clean = Clean.run(model, seqs, heads=edges.level == "head", batch_size=batch_size)
        plan = PatchPlan.make(model, clean, ups, edges.mode, ablation, positions,
                              None if reference is None else model.encode(reference)[0], batch_size)
        cols, _, values = plan.at_columns(clean)
        bad = corrupted_writes(model, ups, values, len(plan.targets), cols.shape[1])
        index = {(u.name, d.name): (i, k) for i, u in enumerate(ups) for k, d in enumerate(downs)}
        margins = []
        for k in want:
            keep = torch.zeros(len(ups), len(downs), dtype=torch.bool)
            for u, d, _ in ranked[:k]:
                keep[index[u, d]] = True
            margins.append(_margins(model, seqs, clean, plan.targets, cols, keep, ups, downs, bad, batch_size))
        m = np.stack(margins)
        reward = clean.reward.cpu().numpy()
        return Circuit(ranked[:n_keep], ranked, want, m, reward[0::2] - reward[1::2], m[0], edges.method, edges.mode,
                       edges.level, [bool(exact[i]) for i in order],
                       0 if edges.verified is None else int(edges.verified.sum()), [float(size[i]) for i in order])


def _nodes(model: RewardModel, edges: Edges) -> tuple[list[Site], list[Receiver]]:
    """The upstream sites and downstream receivers of `edges`, in its order (scored on this model)."""
    ups = nodes(model, edges.level, False)[0]
    if [u.name for u in ups] != edges.upstream:
        raise CircuitError(f"edges were scored on parts {edges.upstream[:3]}..., not this model's "
                           f"{[u.name for u in ups][:3]}...; score them with rl.edges on this model")
    return ups, [Receiver.parse(d) for d in edges.downstream]


def _how_many(flat: np.ndarray, top: int | None, share: float | None) -> int:
    """Edges to keep: `top`, or the fewest ranked edges whose mean |score| sums to `share` of the total."""
    if (top is None) == (share is None):
        raise UsageError(f"pass exactly one of top= (a count) and share= (of the total |score|); got top={top}, "
                         f"share={share}")
    if top is not None:
        if top < 1:
            raise CircuitError(f"a circuit needs at least one edge, got top={top}; pass top >= 1")
        return min(int(top), flat.shape[1])
    assert share is not None
    if not 0 < share <= 1:
        raise CircuitError(f"share is a fraction of the total |score| in (0, 1], got {share}")
    mass = np.cumsum(np.abs(flat).mean(0))
    return int(np.searchsorted(mass, share * mass[-1] - 1e-12) + 1)


def _doubling(n: int) -> list[int]:
    return [k for k in (2 ** i for i in range(n.bit_length() + 1)) if k <= n]


def _margins(model: RewardModel, seqs: list, clean: Clean, targets: list[int], cols: torch.Tensor, keep: torch.Tensor,
             ups: list, downs: list[Receiver], bad: dict[str, torch.Tensor], batch_size: int) -> np.ndarray:
    """Margins [n_pairs] with only `keep`'s edges carrying the run (targets patched, the other side clean)."""
    reward = clean.reward.clone()

    def work(rows: list[int]) -> None:
        index = [targets[j] for j in rows]
        batch = collate([seqs[i] for i in index], pad_id=model.pad_token_id, side="right", first=model.encoder,
                        device=model.device)
        got = circuit_rewards(model, batch, clean.coef[index], cols[rows], keep, ups, downs,
                              {u: v[rows] for u, v in bad.items()})
        reward[torch.tensor(index, device=reward.device)] = got.to(reward.dtype)

    each_batch(list(range(len(targets))), batch_size, work, ids=targets, is_pairs=True)
    r = reward.cpu().numpy()
    return r[0::2] - r[1::2]
