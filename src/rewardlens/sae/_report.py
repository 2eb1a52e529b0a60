"""A feature report: the features that write the most reward, where they fire, and how good the SAE is.

One streamed pass over a corpus at the SAE's layer gives the SAE's fit there (fraction of variance
explained, L0, dead latents) and, for the top features of a `FeatureAttribution`, the token
windows on which each fires hardest.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs
from ..model import RewardModel, TraceKey
from ..types import SaePositions
from ._activations import Activations, ActivationSource
from ._attribution import FeatureAttribution, check_width
from ._autoencoder import TopKSAE
from ._train import evaluate

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Context:
    """Where a feature fired: the token window `text` (the firing token in «»), the `activation`,
    the corpus row `input` and the token `position` in it."""

    text: str
    activation: float
    input: int
    position: int


@dataclass(frozen=True)
class FeatureReport:
    """Top features of an attribution with their corpus statistics, and the SAE's fit on the corpus.

    Per feature [F]: `score` (mean chosen − rejected contribution for pairs, else mean
    contribution; reward units), `alignment` (cos of the decoder row with the read-out),
    `frequency` (share of corpus activations it fires on), `contexts` (strongest first).
    SAE-wide: `fvu`, `l0` (mean active latents), `dead_fraction` (latents that never fired on the
    corpus), over `n_activations` corpus activations at `positions`.
    """

    layer: int
    features: np.ndarray
    score: np.ndarray
    score_kind: Literal["margin", "mean"]
    alignment: np.ndarray
    frequency: np.ndarray
    contexts: list[list[Context]]
    fvu: float
    l0: float
    dead_fraction: float
    n_activations: int
    positions: SaePositions

    @property
    def explained_variance(self) -> float:
        return 1.0 - self.fvu

    def to_frame(self) -> pd.DataFrame:
        """One row per (feature, context), strongest context first."""
        import pandas as pd

        rows = [
            {"feature": int(f), self.score_kind: float(s), "alignment": float(a), "frequency": float(q), "rank": r,
             "activation": c.activation, "input": c.input, "position": c.position, "context": c.text}
            for f, s, a, q, ctx in zip(self.features, self.score, self.alignment, self.frequency, self.contexts)
            for r, c in enumerate(ctx)
        ]
        return pd.DataFrame(rows)

    def plot(self, ax: Axes | None = None) -> Figure:
        """Each feature's score against its alignment with the read-out; into `ax` when given (its figure
        is returned), else a new figure."""
        from ..plotting import finish, one_panel

        ax, made = one_panel(ax, (5, 4))
        ax.scatter(self.alignment, self.score)
        for f, a, s in zip(self.features, self.alignment, self.score):
            ax.annotate(str(f), (a, s), fontsize=7)
        ax.set_xlabel("cos(decoder row, read-out)")
        ax.set_ylabel(f"{self.score_kind} (reward units)")
        return finish(ax, made)


class _TopContexts:
    """Running top-`c` (activation, input, position) of each of `features` over streamed chunks."""

    def __init__(self, features: Tensor, c: int) -> None:
        self.features, self.c = features, c
        n = len(features)
        self.value = torch.zeros(0, n, device=features.device)
        self.seq = torch.zeros(0, n, dtype=torch.long)
        self.pos = torch.zeros(0, n, dtype=torch.long)

    def __call__(self, chunk: Activations, acts: Tensor, idx: Tensor) -> None:
        hit = (idx[:, :, None] == self.features).to(acts.dtype)  # [m, k, F]
        sel = (hit * acts[:, :, None]).sum(1)  # [m, F]: each feature's activation on each row
        top = sel.topk(min(self.c, len(sel)), dim=0)
        rows = top.indices.cpu()
        value = torch.cat([self.value, top.values])
        seq, pos = torch.cat([self.seq, chunk.seq[rows]]), torch.cat([self.pos, chunk.pos[rows]])
        best = value.topk(min(self.c, len(value)), dim=0)
        keep = best.indices.cpu()
        self.value, self.seq, self.pos = best.values, seq.gather(0, keep), pos.gather(0, keep)


def _window(tokenizer: PreTrainedTokenizerBase, ids: list[int], pos: int, before: int, after: int) -> str:
    def text(part: list[int]) -> str:
        # one sequence of ids decodes to one string (the stub also allows a batch's list)
        return cast(str, tokenizer.decode(part)).replace("\n", "\\n")

    return f"{text(ids[max(0, pos - before):pos])}«{text(ids[pos:pos + 1])}»{text(ids[pos + 1:pos + 1 + after])}"


def feature_report(model: RewardModel, sae: TopKSAE, attribution: FeatureAttribution, corpus: Inputs, *,
                   top: int = 10, n_contexts: int = 5, window: int = 8, positions: SaePositions = "all",
                   batch_size: int = 8) -> FeatureReport:
    """Report the `top` features of `attribution` (by |mean margin| for pairs, else |mean contribution|)
    with their `n_contexts` strongest distinct token windows (`window` tokens before, 2 after) in `corpus`.

    `corpus`: strings, conversations or Pairs, read at `positions` ('all' non-pad tokens or 'read').
    """
    check_width(model, sae, attribution.layer)
    kind: Literal["margin", "mean"] = "margin" if attribution.is_pairs else "mean"
    ranked = attribution.top(top, by=kind)
    features = np.array([f for f, _ in ranked], dtype=np.int64)
    enc = sae if sae.b_dec.device == model.device else copy.deepcopy(sae).to(model.device)  # never move the caller's
    source = ActivationSource(model, corpus, TraceKey.resid(attribution.layer), positions=positions,
                              batch_size=batch_size)
    # Extra candidates, so that windows repeated verbatim in the corpus (cloned pairs) count once.
    tops = _TopContexts(torch.as_tensor(features, device=model.device), 4 * n_contexts)
    stats = evaluate(enc, source, visit=tops)
    contexts = []
    for j in range(len(features)):
        ctx: dict[str, Context] = {}
        for value, seq, pos in zip(tops.value[:, j].tolist(), tops.seq[:, j].tolist(), tops.pos[:, j].tolist()):
            text = _window(model.tokenizer, source.tokens(seq), pos, window, 2)
            if value > 0 and text not in ctx and len(ctx) < n_contexts:
                ctx[text] = Context(text, value, seq, pos)
        contexts.append(list(ctx.values()))
    return FeatureReport(
        layer=attribution.layer, features=features, score=np.array([s for _, s in ranked]), score_kind=kind,
        alignment=np.array([attribution.latent_alignment[f] for f in features]),
        frequency=stats.frequency[features] if len(features) else np.zeros(0), contexts=contexts, fvu=stats.fvu,
        l0=stats.l0, dead_fraction=stats.dead_fraction, n_activations=stats.n_rows, positions=positions,
    )
