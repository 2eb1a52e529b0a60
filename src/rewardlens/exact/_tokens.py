"""`tokens`: the reward split exactly over the source tokens it was read from (docs/tokens.md).

At the read position `t*`, head `h` of layer `l` writes `o_h = Σ_s A_h[t*, s] · v_h(s)`: its
attention row at `t*` weighs the values of every source token `s` (the value of the normalised input
at `s`, value bias included; the weights sum to one, so a bias splits with them). The head's exact
contribution to the reward (frozen read-out, docs/design.md §1) is `g_h · o_h`, with
`g_h = (W_Oᵀ u)_h` its read-out vector in the head's value space; so it splits over sources as
`T_{l,h}(s) = A_h[t*, s] · (g_h · v_h(s))` without approximation, and

    reward = Σ_s T(s) + at_read + constant,     T(s) = Σ_{l,h} T_{l,h}(s)

where `at_read` is everything written at `t*` itself that is not an attention row's mix of sources:
the embeddings of `t*`, every MLP output, every attention output bias (and a post-norm's β), and
`constant` the head's bias, the final norm's β term and the post-norm encoders' residual-norm
biases. A token's `T(s)` is a *direct* effect: what reaches the reward through one attention hop
from `s` to `t*`; what `s` does to later layers' inputs at `t*` is in the MLPs and heads there, and
what it does at other positions is in their values. `total_approx` is a first-order estimate of the
total effect (gradient × (embedding − baseline)) for comparison, and says so in its name.

Each token also has a role, the template's, the prompt's or the response's (model/_roles.py), and the
content view (`content`, `groups`; exact/_token_view.py) groups the template's tokens into one row
so that the words of the prompt and the response can be read apart from the scaffolding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs, pair_of, row_labels
from ..data.internal import counting
from ..errors import ArchitectureError, UsageError
from ..model import Part, RewardModel, Trace, TraceKey, trace, verify
from ..model.internal import ROLES, Batch, flatten_inputs, out_projection, roles_of
from ..plotting import TOKEN_ROWS, Html, HtmlView
from ..stats import ranked, spearman, topk_overlap
from ..types import PaddingSide
from ._attention_rows import rows_at_read
from ._decompose import decompose_trace, part_names, readout_vectors
from ._token_grad import total_effect_approx
from ._token_view import content_frame, group_values, ill_conditioned

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Baseline = Literal["zero", "pad"]
BASELINES: tuple[Baseline, ...] = get_args(Baseline)


@dataclass(frozen=True)
class TokenAttribution(HtmlView):
    """Exact per-token direct contributions to the reward, one ragged table per row (module docstring).

    Per row `i` (pairs interleave chosen, rejected: `rows` labels them): `tokens[i]` each token's
    text as the tokenizer decodes it alone, `token_ids[i]` its id; `values[i]` [T_i] float64 the
    exact direct contribution of each source token, summed over layers and heads; `by_layer[i]`
    [T_i, L] the same by layer (heads summed); `per_head[i]` [T_i, L, H] by layer and head (None
    when `tokens(..., heads=False)`: it costs L·H floats per token; built by hand with `per_head`
    only, `by_layer` is its sum over heads). `read_index` [n] the read position `t*` in the row's own
    tokens; `at_read` [n] what is written at `t*` itself (embeddings, MLPs, attention output biases);
    `constant` [n] the head's bias and the norms' constant; `reward` [n] the model's reward (fp32
    head and readout): `reward == values[i].sum() + at_read[i] + constant[i]` to float precision
    (`residual_error`). `total_approx[i]` [T_i] (None when not asked) is a first-order estimate of
    each token's *total* effect, `∂r/∂e_s · (e_s − e_baseline)` on the input embedding `e_s`, with
    `baseline` 'zero' (e = 0) or 'pad' (the pad token's embedding): an approximation. `roles[i]` [T_i]
    int8 each token's role code, `ROLES[code]` ('template', 'prompt', 'response'; model/_roles.py), None
    for an attribution stored before roles existed: the content view needs them.
    """

    rows: list[str]
    is_pairs: bool
    tokens: list[list[str]]
    token_ids: list[list[int]]
    values: list[np.ndarray]
    per_head: list[np.ndarray] | None
    read_index: np.ndarray
    at_read: np.ndarray
    constant: np.ndarray
    reward: np.ndarray
    total_approx: list[np.ndarray] | None = None
    baseline: Baseline | None = None
    by_layer: list[np.ndarray] = field(default_factory=list)
    roles: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        if not self.by_layer:  # built by hand with the per-head split only: sum its heads
            if self.per_head is None:
                raise UsageError("a TokenAttribution needs by_layer or per_head")
            object.__setattr__(self, "by_layer", [p.sum(-1) for p in self.per_head])

    @property
    def n_layers(self) -> int:
        return int(self.by_layer[0].shape[1])

    @property
    def residual_error(self) -> np.ndarray:
        """reward − (Σ_s values + at_read + constant) [n]: float error only; the split is exact."""
        return self.reward - np.array([v.sum() for v in self.values]) - self.at_read - self.constant

    def per_layer(self, row: int) -> np.ndarray:
        """[T, L]: each source token's contribution through each layer's attention (heads summed)."""
        return self.by_layer[row]

    def head(self, row: int, layer: int, head: int) -> np.ndarray:
        """[T]: one head's exact contribution split over the source tokens of `row`."""
        if self.per_head is None:
            raise UsageError("no per-head split was kept: call rewardlens.tokens(..., heads=True)")
        return self.per_head[row][:, layer, head]

    def top(self, row: int, k: int = 10, role: str | None = None) -> list[tuple[int, str, float]]:
        """The `k` tokens of `row` with the largest |value|: (position, token text, value), largest first;
        `role` ('response', 'prompt' or 'template') keeps that role's tokens only."""
        vals, keep = self.values[row], np.arange(len(self.values[row]))
        if role is not None:
            keep = np.flatnonzero(self._roles(row) == ROLES.index(role)) if role in ROLES else _bad_role(role)
        return [(int(keep[i]), self.tokens[row][keep[i]], float(vals[keep[i]])) for i in ranked(np.abs(vals[keep]), k)]

    def _roles(self, row: int) -> np.ndarray:
        if self.roles is None:
            raise UsageError("this token attribution has no token roles (stored before they existed): compute it "
                             "again with rewardlens.tokens(model, inputs)")
        return self.roles[row]

    def role_names(self, row: int) -> list[str]:
        """Each token's role in `row`: 'template', 'prompt' or 'response' (docs/tokens.md, the content view)."""
        return [ROLES[int(c)] for c in self._roles(row)]

    def groups(self, row: int) -> dict[str, float]:
        """The exact direct split of `row` grouped: Σ response tokens, Σ prompt tokens, Σ template tokens,
        `at_read` and `constant`; the five sum to the reward (to float precision)."""
        return group_values(self.values[row], self._roles(row), float(self.at_read[row]), float(self.constant[row]))

    def ill_conditioned(self, row: int) -> bool:
        """Whether `row`'s reward is under 10 % of Σ|groups|, so that shares of it swing: read the values."""
        return ill_conditioned(self.groups(row))

    def content(self, row: int) -> pd.DataFrame:
        """The content view of `row`: each response token, each prompt token, then one row each for the
        template's tokens, `at_read` and `constant` (`role`, `position` (−1 on a grouped row), `token`, `value`,
        `total_approx` when computed, `share` = value / reward); `value` sums to the reward."""
        approx = None if self.total_approx is None else self.total_approx[row]
        return content_frame(self.tokens[row], self.values[row], self._roles(row), approx,
                             float(self.at_read[row]), float(self.constant[row]))

    def table(self, row: int) -> pd.DataFrame:
        """One row's tokens in order: position, token, value (and total_approx), `is_read` marks `t*`, `role`
        each token's role (when known)."""
        import pandas as pd

        data: dict[str, object] = {
            "position": np.arange(len(self.values[row])), "token": self.tokens[row], "value": self.values[row],
        }
        if self.total_approx is not None:
            data["total_approx"] = self.total_approx[row]
        data["is_read"] = np.arange(len(self.values[row])) == self.read_index[row]
        if self.roles is not None:
            data["role"] = self.role_names(row)
        return pd.DataFrame(data)

    def pair(self, i: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Pair `i`'s (chosen, rejected) token tables, side by side and *not* subtracted.

        Each side has its own tokens, so no token-level chosen − rejected exists: only the sums
        differ meaningfully (`values.sum() + at_read + constant` is each side's reward)."""
        if not self.is_pairs:
            raise UsageError("pair() needs inputs given as rewardlens.Pair")
        rows = [r for r in range(len(self.rows)) if pair_of(r)[0] == i]
        if len(rows) != 2:
            raise IndexError(f"pair {i} out of range for {len(self.rows) // 2} pairs")
        return self.table(rows[0]), self.table(rows[1])

    def agreement(self, k: int = 5) -> pd.DataFrame:
        """Per row: how `total_approx` ranks tokens against the exact direct split (`values`).

        `spearman`: Spearman ρ between the two (NaN when undefined); `topk_overlap`: share of the top-`k`
        tokens by |value| that both put there. Direct and total effects are different estimands:
        disagreement is information about indirect paths, not an error in either."""
        import pandas as pd

        if self.total_approx is None:
            raise UsageError("no total_approx: call rewardlens.tokens(..., approx=True)")
        out = []
        for label, exact, approx in zip(self.rows, self.values, self.total_approx):
            kk = min(k, len(exact))
            out.append({"row": label, "spearman": spearman(exact, approx),
                        "topk_overlap": topk_overlap(np.abs(exact), np.abs(approx), kk), "k": kk})
        return pd.DataFrame(out)

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per (input row, token) with position, token text, value (and total_approx)."""
        import pandas as pd

        frames = [self.table(i).assign(row=label) for i, label in enumerate(self.rows)]
        frame = pd.concat(frames, ignore_index=True)
        return frame[["row", *[c for c in frame.columns if c != "row"]]]

    _html_table = False

    def _html_body(self) -> Html:
        """The notebook's token view: each row's tokens coloured by `values` (plotting/_token_html.py), pairs
        side by side, its header the row's exact split (`groups` when roles are known)."""
        from ..plotting import token_rows, token_view

        n = min(len(self.rows), TOKEN_ROWS)
        roles = [self.role_names(r) if self.roles is not None else None for r in range(n)]
        return token_view(token_rows(self.rows[:n], [self._split(r) for r in range(n)], self.tokens[:n],
                                     self.values[:n], self.read_index[:n], roles), self.is_pairs, TOKEN_ROWS)

    def _split(self, row: int) -> str:
        """`row`'s reward and its exact split, in one line."""
        if self.roles is None:
            return (f"{self.rows[row]}: reward {self.reward[row]:+.4g} = Σ tokens {self.values[row].sum():+.4g} "
                    f"+ at read {self.at_read[row]:+.4g} + constant {self.constant[row]:+.4g}")
        g = self.groups(row)
        return (f"{self.rows[row]}: reward {self.reward[row]:+.4g} = response {g['response']:+.4g} + prompt "
                f"{g['prompt']:+.4g} + template {g['template']:+.4g} + at read {g['at_read']:+.4g} + constant "
                f"{g['constant']:+.4g}")

    def plot(self, row: int = 0, ax: Axes | None = None) -> Figure:
        """Bar chart of every token's exact contribution for `row`, tokens in order, `t*` marked; into
        `ax` when given (its figure is returned), else a new figure."""
        from ..plotting import finish, one_panel

        vals = self.values[row]
        ax, made = one_panel(ax, (max(4.0, 0.3 * len(vals) + 1), 3))
        colors = ["tab:blue" if v >= 0 else "tab:red" for v in vals]
        ax.bar(np.arange(len(vals)), vals, color=colors)
        ax.set_xticks(np.arange(len(vals)), [repr(t)[1:-1] for t in self.tokens[row]], rotation=90, fontsize=7)
        ax.axvline(int(self.read_index[row]), color="gray", linestyle=":", linewidth=1)
        ax.set_ylabel("direct contribution (reward units)")
        ax.set_title(f"{self.rows[row]}: Σ tokens {vals.sum():+.3f}, at t* {self.at_read[row]:+.3f}, "
                     f"constant {self.constant[row]:+.3f} = reward {self.reward[row]:+.3f}", fontsize=8)
        return finish(ax, made)


def head_readouts(model: RewardModel, tr: Trace, coef: Tensor) -> dict[int, Tensor]:
    """Each head's read-out vector in its own value space, `g_h = (W_Oᵀ u)_h` [n, H, d_head] per layer:
    `u` the readout-contracted read-out vector where the layer's attention writes, pulled back
    through an attention post-norm (scale frozen) where there is one. A head's contribution is
    `g_h · o_h`, exactly as the decomposition computes it."""
    _, u_attn, _, _ = readout_vectors(model, tr, coef)
    post, out = model.arch.attn_post_norm, {}
    for layer in range(model.n_layers):
        u = u_attn[layer]
        if post is not None:
            u, _ = model.norm(post, layer).pullback(u, tr[TraceKey.attn(layer)])
        weight, _ = out_projection(model, "attn", layer)
        out[layer] = (u @ weight)[:, 0].view(u.shape[0], model.n_heads, -1)
    return out


def _check_closure(model: RewardModel, split: Tensor, heads: Tensor, scale: Tensor, labels: list[str]) -> None:
    """Σ_s of the recomputed split [n, L, H, T] must equal each head's value [n, L, H] from its own output."""
    gap = ((split.sum(-1) - heads).abs().sum((1, 2)) / scale.clamp_min(1e-6))
    tol = 1e-3 if next(model.model.parameters()).dtype == torch.float32 else 5e-2
    worst = int(gap.argmax())
    if float(gap[worst]) > tol:
        raise ArchitectureError(
            f"{labels[worst]}: the heads' contributions recomputed from attention rows at the read position miss "
            f"their exact values by {float(gap[worst]):.2e} of Σ|parts| (tolerance {tol:g}): something between the "
            f"attention kernel and the output projection of {model.arch.name!r} is not a plain head concatenation"
        )


def _split_batch(
    model: RewardModel, batch: Batch, is_head: np.ndarray, labels: list[str]
) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray, Tensor]:
    """One batch: the split [b, L, H, T] (float64, padded columns zero), every part's value [b, P] in
    `part_names(model, 'head', all layers)` order, the constant [b], the reward [b] and the readout [b, k]."""
    fine = set(range(model.n_layers))
    tr = trace(model, batch, heads=fine)
    out, coef = model.head_readout(tr.captured)
    vals, _, consts = decompose_trace(model, tr, "head", fine, coef)
    parts = vals[:, 0].double()  # [b, P]
    split = rows_at_read(model, batch, head_readouts(model, tr, coef)).split
    stacked = torch.stack([split[layer].to(parts.device) for layer in sorted(split)], dim=1).double()
    heads = parts[:, torch.as_tensor(is_head, device=parts.device)].view(len(labels), model.n_layers, -1)
    _check_closure(model, stacked, heads, parts.abs().sum(-1), labels)
    constant = torch.stack([c[:, 0].double() for c in consts.values()]).sum(0)
    reward = (out * coef).sum(-1).double()
    return stacked, parts.cpu().numpy(), constant.cpu().numpy(), reward.cpu().numpy(), coef


def tokens(
    model: RewardModel,
    inputs: Inputs,
    *,
    batch_size: int = 8,
    padding_side: PaddingSide = "right",
    approx: bool = True,
    baseline: Baseline = "zero",
    heads: bool = True,
    progress: bool = False,
) -> TokenAttribution:
    """Exact split of each input's reward over its source tokens (module docstring; docs/tokens.md).

    Per batch: one traced forward (the read-out vectors and every part at `t*`), one forward that
    recomputes every layer's attention row at `t*` from the kernel's own queries and keys (sdpa,
    eager or flash: no switch), and with `approx=True` one backward for `total_approx`
    (gradient × (embedding − `baseline`), 'zero' or 'pad'). `heads=False` keeps the per-layer split
    but drops the per-head one (L·H floats per token). `reward == Σ_s values + at_read + constant`
    to float precision; a gap above tolerance raises `ArchitectureError`. `progress`: a bar of batches.
    Every token's role (template, prompt or response) is found from the text (model/_roles.py) for the
    content view (`TokenAttribution.content`).
    """
    if baseline not in BASELINES:
        raise UsageError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if not model.verified:
        verify(model)
    seqs, is_pairs = model.encode(inputs)
    roles = roles_of(model.tokenizer, flatten_inputs(inputs)[0], [s.ids for s in seqs], encoder=model.encoder,
                     question=model.judge)
    n, n_layers = len(seqs), model.n_layers
    labels = row_labels(n, is_pairs)
    by_layer: list[np.ndarray] = [np.zeros(0)] * n
    per_head: list[np.ndarray] = [np.zeros(0)] * n
    approx_rows: list[np.ndarray] = [np.zeros(0)] * n
    read_index, at_read, constant, reward = (np.zeros(n, dtype=int), np.zeros(n), np.zeros(n), np.zeros(n))
    is_head = np.array([Part.parse(p).head is not None for p in part_names(model, "head", range(n_layers))])
    with counting("tokens", progress):
        for rows, batch in model.batches(seqs, batch_size, padding_side, is_pairs):
            names = [labels[int(i)] for i in rows]
            stacked, vals, constants, rewards, coef = _split_batch(model, batch, is_head, names)
            totals = total_effect_approx(model, batch, coef, baseline) if approx else None
            reward[rows], constant[rows] = rewards, constants
            at_read[rows] = vals[:, ~is_head].sum(-1)
            for j, row in enumerate(rows):
                real = batch.attention_mask[j].bool()
                mine = stacked[j][..., real].permute(2, 0, 1)  # [T_r, L, H]
                by_layer[row] = mine.sum(-1).cpu().numpy()
                if heads:
                    per_head[row] = mine.cpu().numpy()
                read_index[row] = int(real[: int(batch.read_index[j])].sum())
                if totals is not None:
                    approx_rows[row] = totals[j][real].double().cpu().numpy()
    texts = [[str(model.tokenizer.decode([i])) for i in s.ids] for s in seqs]
    return TokenAttribution(
        rows=labels, is_pairs=is_pairs, tokens=texts, token_ids=[list(s.ids) for s in seqs],
        values=[b.sum(1) for b in by_layer], by_layer=by_layer, per_head=per_head if heads else None,
        read_index=read_index, at_read=at_read,
        constant=constant, reward=reward, total_approx=approx_rows if approx else None,
        baseline=baseline if approx else None, roles=roles,
    )


def _bad_role(role: str) -> np.ndarray:
    raise UsageError(f"role must be one of {ROLES}, got {role!r}")
