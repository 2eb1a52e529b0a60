"""`circuit`: keep the top edges and measure how much of the clean margin they carry alone.

Edges are ranked by mean |score| over pairs (`stats.top_parts`). A circuit of the k first edges is
evaluated by edge ablation (below): every edge outside it carries its upstream part's
corrupted write, and the faithfulness (`share`) is each pair's circuit margin against its own clean
margin, pooled with weights |m_i| (`stats.margin_share`: `Σ sign(m_i)·m_i(C) / Σ |m_i|`; 1 for every
edge; `empty` is the margin with no edge kept), which pairs whose margins disagree in sign cannot send
through a near-zero denominator. The ratio of means `mean margin(C) / mean clean margin` is kept as
`share_of_mean_margin`, and `warning` (`stats.share_warning`) says when it is ill-conditioned. The curve
runs over circuit sizes. Sublayer or head level
(heads as parts, each head's input, or its q/k/v inputs apart, as nodes), as the edges were scored.
With `verify=n` the cheap scores only propose: the estimated edges among the first n are path-patched
(`Edges.verify`) and the ranking is by those exact scores; `exact` marks, per ranked edge, which are.

Edge-ablation runs: node d (a sublayer's input, a head's query/key/value input, or the read-out) reads
`x_d + δ_d` with, at the patched columns, `δ_d = Σ_{u → d ∉ C} (w'_u − w_u)`: `w_u` what upstream part u
writes *in this run* (recorded as it is written; a head's `z_h W_O[:, h]ᵀ` from the output projection's
input), `w'_u` its corrupted write (`patch`'s value through u's own post-norm; a head's corrupted
`z'_h W_O[:, h]ᵀ`). So d sees the current write of its circuit parents and the corrupted write of every other
part, the residual stream unchanged (`_receivers.receiving_all`, every node in one forward). C = every edge
gives the clean run; C = ∅ every node reading the per-part corrupted stream.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs, Pair, margin
from ..data.internal import counting
from ..errors import ArchitectureError, CircuitError, UsageError
from ..model import RewardModel, TraceKey
from ..model.internal import Batch, collate, each_batch, rewriting
from ..plotting import HtmlView
from ..stats import margin_share, mean_abs, share_warning, summary_frame, to_json, top_parts
from ..types import Ablation, Mode, Positions, Spans
from ._direct import post_normed
from ._edge_nodes import Level, check_model, nodes
from ._edges import Edges, Method
from ._edges import edges as edge_scores
from ._engine import Site, head_write
from ._plan import Clean, PatchPlan, pair_seqs
from ._receivers import Receiver, read_depth, receiving_all, sublayer_write, wiring, write_depth
from ._registry import Provenance
from ._spec import PatchSpec, spec_of
from ._verify_edges import check_verify

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Circuit(HtmlView):
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
    def provenance(self) -> Provenance:
        """How the margins were computed: edge ablation (one forward per batch and size) on `method`'s ranking."""
        return Provenance("edge_ablation", proof=f"ranked by {self.method}, {self.verified} edges path-patched")

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
        return to_json(self.to_dict())

    def summary(self) -> pd.DataFrame:
        """The headline numbers, one row each (`stats.summary_frame`): `share` (of each pair's clean margin the
        kept circuit carries), `share_of_mean_margin`, the mean and mean |clean margin|, the empty circuit's
        mean margin, the edges kept and how many were verified; `n` the pairs."""
        n = len(self.clean)
        d = self.to_dict()
        names = ("share", "share_of_mean_margin", "clean_margin", "mean_abs_clean_margin", "empty_margin")
        return summary_frame([*({"name": k, "value": d[k], "n": n} for k in names),
                              {"name": "edges_kept", "value": len(self.kept), "n": n},
                              {"name": "verified", "value": self.verified, "n": n}])

    def to_dict(self) -> dict[str, Any]:
        """Every number as a JSON-ready nested dict: the headline numbers, the kept edges and the share curve
        (what `rewardlens circuit --json` and the audit's `numbers.json` write)."""
        exact = self.exact or [d == "reward" for _, d, _ in self.ranked]  # a result made before `exact` existed
        size = self.mean_abs or [float("nan")] * len(self.ranked)  # a result made before `mean_abs` was kept
        return {"method": self.method, "mode": self.mode, "level": self.level, "engine": str(self.provenance),
                "share": self.share,
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
    node = Receiver.parse(name)  # an upstream part's name is also its input's (a sublayer or a head)
    return node.layer + (0.5 if node.kind == "mlp" else 0)


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
    spec: PatchSpec | None = None,
) -> Circuit:
    """Rank every edge (`edges`, else `rl.edges` with `method`, `level` and `qkv`), keep the `top` first
    (or the fewest whose mean |score| reaches `share` of the total), and evaluate circuits of `sizes`
    edges (default: doubling up to every edge, and the kept one) by edge ablation, all of its nodes
    (heads and their q/k/v inputs at `level='head'`) in one forward per batch and size. `verify=n`:
    rank by exact scores, the estimated edges among the first n path-patched (`Edges.verify`, this
    corruption) until the first n are all exact. `spec`: the corruption (mode, ablation, positions) as one
    `PatchSpec`, instead of those keywords (its level and estimand are not used: `level` and the edges say them)."""
    n_verify = check_verify(verify)
    with counting("circuit", progress):
        check_model(model, "circuit")
        if model.arch.layout == "post_norm" and model.arch.attn_post_norm is None:
            raise ArchitectureError("circuit: a post-norm encoder renormalises the stream after every sublayer, so "
                                    "edge ablation is not a sum of writes; use rl.edges and rl.path_patch")
        if (edges.level if edges is not None else level) == "head":
            check_heads(model)
        spec = spec_of(spec, mode=(mode or "noising") if spec is None else mode, ablation=ablation,
                       positions=positions)
        ablation, positions = spec.ablation, spec.positions
        if edges is None:
            edges = edge_scores(model, pairs, method=method, steps=steps, level=level, qkv=qkv, spec=spec,
                                reference=reference, batch_size=batch_size)
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
        return Circuit(ranked[:n_keep], ranked, want, m, margin(reward), m[0], edges.method, edges.mode,
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
    return margin(reward.cpu().numpy())


def check_heads(model: RewardModel) -> None:
    """Head-level edge ablation needs a head's write to be its own term of the stream (no attention
    post-norm: Gemma-2, OLMo-2 renormalise the heads' sum, so one head's change is not additive) and
    a head's own query input (separate projections, no q norm over every head)."""
    if model.arch.attn_post_norm is not None:
        raise ArchitectureError(f"circuit: map {model.arch.name!r} normalises the attention output after the "
                                "heads are summed, so one head's write is not a term of the stream; evaluate "
                                "circuits at level='sublayer'")
    wiring(model, Receiver("head", 0, 0, "q"))  # refuses what no head receiver can have: fused qkv, q/k norms


def corrupted_writes(model: RewardModel, ups: list[Site], values: dict[TraceKey, Tensor], n: int, m: int,
                     ) -> dict[str, Tensor]:
    """w'_u [n_targets, m, d]: what each upstream part writes with its corrupted activation."""
    out = {}
    for u in ups:
        v = values[u.key].to(model.device).float()
        v = v.expand(n, m, v.shape[-1]) if v.ndim == 1 else v
        if u.head is not None:
            out[u.name] = head_write(model, u, v)
        else:
            out[u.name] = v if u.kind == "embed" else post_normed(model, u.kind, u.layer, v)
    return out


def _record(store: dict[str, Tensor], name: str, rows: Tensor, cols: Tensor, x: Tensor) -> None:
    store[name] = x[rows, cols].float()


def _record_heads(model: RewardModel, store: dict[str, Tensor], heads: list[Site], rows: Tensor, cols: Tensor,
                  z: Tensor) -> None:
    for u in heads:
        store[u.name] = head_write(model, u, z[rows, cols])


def _fill(buf: Tensor, parents: list[str], cur: dict[str, Tensor], bad: dict[str, Tensor], rows: Tensor,
          cols: Tensor, _x: Tensor) -> None:
    """δ_d at the patched columns, written in place into the buffer the node reads (before it runs)."""
    buf.zero_()
    for u in parents:
        buf[rows, cols] += (bad[u] - cur[u]).to(buf.dtype)


def circuit_rewards(model: RewardModel, batch: Batch, coef: Tensor, cols: Tensor, keep: Tensor,
                    ups: list[Site], downs: list[Receiver], bad: dict[str, Tensor]) -> Tensor:
    """Rewards [B] of one batch with only the edges in `keep` [U, D] carrying the run; `cols` [B, m] the
    patched columns (padding columns repeat a real one with zero change), `bad` the corrupted writes of
    these rows. One forward: every node's δ is filled just before the node reads it."""
    b, t = batch.input_ids.shape
    rows = torch.arange(b, device=model.device)[:, None]
    c = cols.to(model.device)
    cur: dict[str, Tensor] = {}
    hooks = [(model.layers[0], "in", functools.partial(_record, cur, "embed", rows, c))]
    hooks += [(sublayer_write(model, u.kind, u.layer), "out", functools.partial(_record, cur, u.name, rows, c))
              for u in ups if u.kind != "embed" and u.head is None]
    for layer in sorted({u.layer for u in ups if u.head is not None}):
        heads = [u for u in ups if u.head is not None and u.layer == layer]
        hooks.append((model.layer_module(layer, model.arch.attn_out), "in",
                      functools.partial(_record_heads, model, cur, heads, rows, c)))
    bufs = {d: torch.zeros(b, t, model.d_model, device=model.device) for d in downs}
    for k, d in enumerate(downs):
        parents = [u.name for i, u in enumerate(ups)
                   if write_depth(model, u) <= read_depth(model, d) and not keep[i, k]]
        at = (model.layers[d.layer], "in") if d.kind == "head" else wiring(model, d).add
        hooks.append((at[0], at[1], functools.partial(_fill, bufs[d], parents, cur, bad, rows, c)))
    final = model.final_points(batch, gate=False)
    with rewriting(hooks), receiving_all(model, bufs):  # registered after the fills: they run first
        got = model.run(batch, final)
    return (model.head_values(model.final_hidden(got[TraceKey.final()]), batch) * coef).sum(-1)

