"""A feature report: the features that write the most reward, what each one rewards, and how good the SAE is.

One streamed pass over a corpus at the SAE's layer gives the SAE's fit there (fraction of variance
explained, L0, dead latents) and, for the top features of a `FeatureAttribution`, a `FeatureCard`
each (`_cards.py`): the token windows on which it fires hardest with its activation on every token,
its peak per sequence (for correlations with the caller's axes), and, from the attribution, its
direct write along the read-out and its activation on chosen vs rejected at the read position.
Memory is bounded by the report, not the corpus: a running top-`c` per feature, never all activations.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor

from ..data import Inputs
from ..errors import DataError
from ..model import RewardModel, TraceKey
from ..plotting import HtmlView
from ..stats import to_json
from ..types import SaePositions
from ._activations import Activations, ActivationSource
from ._attribution import FeatureAttribution, check_width
from ._autoencoder import TopKSAE
from ._cards import Context, FeatureCard, FeatureCards, ScoreKind, check_axes, correlations, direct_write, read_sides
from ._total import FeatureTotals
from ._train import evaluate

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from transformers import PreTrainedTokenizerBase

__all__ = ["Context", "FeatureReport", "feature_report"]


@dataclass(frozen=True)
class FeatureReport(HtmlView):
    """Top features of an attribution with their cards, and the SAE's fit on the corpus.

    `cards`: one `FeatureCard` per feature, strongest-ranked first (`features`, `score`,
    `alignment` = cos of the decoder row with the read-out, `frequency` = share of corpus
    activations it fires on, and `contexts`, strongest first, read off them). SAE-wide: `fvu`,
    `l0` (mean active latents), `dead_fraction` (latents that never fired on the corpus), over
    `n_activations` corpus activations at `positions`.
    """

    layer: int
    score_kind: ScoreKind
    cards: FeatureCards
    fvu: float
    l0: float
    dead_fraction: float
    n_activations: int
    positions: SaePositions

    @property
    def features(self) -> np.ndarray:
        return np.array([c.feature for c in self.cards], dtype=np.int64)

    @property
    def score(self) -> np.ndarray:
        return np.array([c.score for c in self.cards], dtype=np.float64)

    @property
    def alignment(self) -> np.ndarray:
        return np.array([c.alignment for c in self.cards], dtype=np.float64)

    @property
    def frequency(self) -> np.ndarray:
        return np.array([c.frequency for c in self.cards], dtype=np.float64)

    @property
    def contexts(self) -> list[list[Context]]:
        return [list(c.contexts) for c in self.cards]

    @property
    def explained_variance(self) -> float:
        return 1.0 - self.fvu

    def to_frame(self) -> pd.DataFrame:
        """One row per (feature, context), strongest context first (`cards.to_frame()`: one row per feature)."""
        import pandas as pd

        rows = [
            {"feature": c.feature, self.score_kind: c.score, "alignment": c.alignment, "frequency": c.frequency,
             "rank": r, "activation": x.activation, "input": x.input, "position": x.position, "context": x.text}
            for c in self.cards for r, x in enumerate(c.contexts)
        ]
        return pd.DataFrame(rows)

    def to_json(self) -> str:
        """Strict JSON of the SAE's fit and every card (NaN written as null)."""
        fit = {"fvu": self.fvu, "explained_variance": self.explained_variance, "l0": self.l0,
               "dead_fraction": self.dead_fraction, "n_activations": self.n_activations, "positions": self.positions}
        return to_json({"score_kind": self.score_kind, "fit": fit, **self.cards.to_dict()})

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


class _Candidate(NamedTuple):
    """One kept context of one feature: its activation, where it is, its window's activations [W] and its key."""

    value: float
    seq: int
    pos: int
    window: list[float]
    key: tuple[tuple[int, ...], int]


class _Stream:
    """Over streamed chunks, for each of `features` [F]: the running top-`c` contexts with distinct windows
    (each with the feature's activation on the tokens `before`..`after` around it, NaN where the chunk has no
    such token), and each sequence's peak activation `seq_max` [n_seq, F].

    Windows are told apart by their token ids (and the firing token's place in them): a chat template's
    prefix repeats verbatim in every sequence, and copies of one window must not crowd out the others."""

    def __init__(self, features: Tensor, c: int, before: int, after: int, tokens: Callable[[int], list[int]],
                 n_seq: int) -> None:
        self.features, self.c, self.before, self.after, self.tokens = features, c, before, after, tokens
        self.best: list[list[_Candidate]] = [[] for _ in range(len(features))]
        self.seq_max = torch.zeros(n_seq, len(features))

    def key(self, seq: int, pos: int) -> tuple[tuple[int, ...], int]:
        ids, lo = self.tokens(seq), max(0, pos - self.before)
        return tuple(ids[lo:pos + self.after + 1]), pos - lo

    def __call__(self, chunk: Activations, acts: Tensor, idx: Tensor) -> None:
        hit = (idx[:, :, None] == self.features).to(acts.dtype)  # [m, k, F]
        sel = (hit * acts[:, :, None]).sum(1).float().cpu()  # [m, F]: each feature's activation on each row
        if not len(sel):
            return
        # activations are >= 0, so the zeros the peaks start from are neutral
        self.seq_max.scatter_reduce_(0, chunk.seq[:, None].expand_as(sel), sel, "amax")
        order = sel.argsort(0, descending=True)
        windows = _Windows(chunk, self.before, self.after)
        seqs, poss = chunk.seq.tolist(), chunk.pos.tolist()
        for j in range(sel.shape[1]):
            picked = self._pick(j, seqs, poss, order[:, j].tolist(), sel[order[:, j], j].tolist())
            if picked:
                rows = [r for r, _, _ in picked]
                found = [_Candidate(v, seqs[r], poss[r], w, k)
                         for (r, v, k), w in zip(picked, windows(sel[:, j], rows).tolist())]
                self.best[j] = _distinct(sorted(self.best[j] + found, key=lambda t: -t.value), self.c)

    def _pick(self, j: int, seqs: list[int], poss: list[int], order: list[int],
              values: list[float]) -> list[tuple[int, float, tuple[tuple[int, ...], int]]]:
        """(row, activation, key) of the chunk's `c` strongest distinct windows of column `j` (rows in
        `order`, activations `values` in that order) that could enter its top."""
        kept = self.best[j]
        floor = kept[-1].value if len(kept) == self.c else 0.0  # nothing at or below it can enter
        picked: list[tuple[int, float, tuple[tuple[int, ...], int]]] = []
        seen: set[tuple[tuple[int, ...], int]] = set()
        for r, v in zip(order, values):
            if v <= floor or len(picked) == self.c:
                break
            key = self.key(seqs[r], poss[r])
            if key not in seen:
                seen.add(key)
                picked.append((r, v, key))
        return picked


def _distinct(cands: list[_Candidate], c: int) -> list[_Candidate]:
    """The first `c` candidates with distinct keys (`cands` strongest first)."""
    out: list[_Candidate] = []
    seen: set[tuple[tuple[int, ...], int]] = set()
    for cand in cands:
        if cand.key not in seen and len(out) < c:
            seen.add(cand.key)
            out.append(cand)
    return out


class _Windows:
    """A chunk's rows by (sequence, position): a chunk holds whole sequences (one model batch), so a window's
    tokens are in the same chunk when the pass read them."""

    def __init__(self, chunk: Activations, before: int, after: int) -> None:
        seq, self.pos = chunk.seq.cpu(), chunk.pos.cpu()
        self.local = torch.unique(seq, return_inverse=True)[1]
        self.width = int(self.pos.max()) + 1
        self.table = torch.full((int(self.local.max()) + 1, self.width), -1, dtype=torch.long)
        self.table[self.local, self.pos] = torch.arange(len(seq))
        self.offsets = torch.arange(-before, after + 1)

    def __call__(self, col: Tensor, rows: list[int]) -> Tensor:
        """[r, W]: `col`'s value at offsets −before..after of each row's token (NaN where not read)."""
        at_rows = torch.as_tensor(rows, dtype=torch.long)
        p = self.pos[at_rows][:, None] + self.offsets
        at = self.table[self.local[at_rows][:, None].expand_as(p), p.clamp(0, self.width - 1)]
        at = torch.where((p >= 0) & (p < self.width), at, -1)
        return torch.where(at >= 0, col[at.clamp_min(0)], torch.nan)


def _decode(tokenizer: PreTrainedTokenizerBase, part: list[int]) -> str:
    # one sequence of ids decodes to one string (the stub also allows a batch's list)
    return cast(str, tokenizer.decode(part)).replace("\n", "\\n")


def _context(tokenizer: PreTrainedTokenizerBase, ids: list[int], value: float, seq: int, pos: int,
             window: list[float], before: int, after: int) -> Context:
    """The context at token `pos` of `ids`: its text window (firing token in «») and its tokens with the
    feature's activation on each (`window`: offsets −before..after, clipped to the sequence)."""
    text = (f"{_decode(tokenizer, ids[max(0, pos - before):pos])}«{_decode(tokenizer, ids[pos:pos + 1])}»"
            f"{_decode(tokenizer, ids[pos + 1:pos + 1 + after])}")
    lo, hi = max(0, pos - before), min(len(ids), pos + after + 1)
    tokens = tuple(str(tokenizer.decode([i])) for i in ids[lo:hi])
    values = tuple(float(v) for v in window[lo - (pos - before):hi - (pos - before)])
    return Context(text, value, seq, pos, tokens, values, pos - lo)


def _contexts(stream: _Stream, j: int, tokenizer: PreTrainedTokenizerBase, n_contexts: int) -> tuple[Context, ...]:
    """Feature column `j`'s strongest `n_contexts` windows with distinct texts."""
    ctx: dict[str, Context] = {}
    for cand in stream.best[j]:
        if len(ctx) >= n_contexts:
            break
        c = _context(tokenizer, stream.tokens(cand.seq), cand.value, cand.seq, cand.pos, cand.window, stream.before,
                     stream.after)
        ctx.setdefault(c.text, c)
    return tuple(ctx.values())


def _ranked(attribution: FeatureAttribution, ranking: FeatureTotals | None,
            top: int) -> tuple[ScoreKind, list[tuple[int, float]]]:
    """(score kind, the `top` (latent, score) pairs): by the attribution's direct margin (mean for non-pairs), or
    by `ranking`'s first-order total effect, which must come from the attribution's own inputs and layer."""
    by: Literal["margin", "mean"] = "margin" if attribution.is_pairs else "mean"
    if ranking is None:
        return by, attribution.top(top, by=by)
    ranked = ranking.top(top, by=by)
    fired = set(attribution.features.tolist())
    if (ranking.layer != attribution.layer or ranking.rows != attribution.rows
            or any(f not in fired for f, _ in ranked)):
        raise DataError(f"ranking= is a FeatureTotals of {len(ranking.rows)} inputs at layer {ranking.layer}, the "
                        f"attribution one of {len(attribution.rows)} at layer {attribution.layer}, firing other "
                        "features; compute both on the same inputs and layer (feature_totals(model, sae, inputs, "
                        "layer=...))")
    return "total_approx", ranked


def feature_report(model: RewardModel, sae: TopKSAE, attribution: FeatureAttribution, corpus: Inputs, *,
                   top: int = 10, n_contexts: int = 5, window: int = 8, positions: SaePositions = "all",
                   batch_size: int = 8, axes: Mapping[str, Any] | None = None,
                   ranking: FeatureTotals | None = None) -> FeatureReport:
    """Report the `top` features of `attribution` (by |mean margin| for pairs, else |mean contribution|; with
    `ranking`, a `feature_totals` of the same inputs, by its first-order total effect instead, which finds
    features that act through later layers), each with a `FeatureCard`: its `n_contexts` strongest distinct
    token windows (`window` tokens before, 2 after) in `corpus`, with the activation on each token, and the
    numbers of `_cards.py`.

    `corpus`: strings, conversations or Pairs (pairs' chosen and rejected responses; probe items'
    texts), read at `positions` ('all' non-pad tokens or 'read'), `batch_size` sequences per forward.
    `axes`: name → one score per corpus sequence (pairs: chosen, rejected interleaved) or, for pairs,
    per pair; each card gets the Spearman ρ of the feature's per-sequence peak activation with it (or
    of the chosen − rejected peak, per pair). `text_axes` builds them from tests on text.
    """
    check_width(model, sae, attribution.layer)
    kind, ranked = _ranked(attribution, ranking, top)
    features = np.array([f for f, _ in ranked], dtype=np.int64)
    enc = sae if sae.b_dec.device == model.device else copy.deepcopy(sae).to(model.device)  # never move the caller's
    source = ActivationSource(model, corpus, TraceKey.resid(attribution.layer), positions=positions,
                              batch_size=batch_size)
    checked = check_axes(axes, len(source.seqs), source.is_pairs)
    # Extra candidates, for distinct windows that decode to one text.
    stream = _Stream(torch.as_tensor(features, device=model.device), 2 * n_contexts, window, 2, source.tokens,
                     len(source.seqs))
    stats = evaluate(enc, source, visit=stream)
    col = {int(f): i for i, f in enumerate(attribution.features)}
    cards = []
    for j, (f, score) in enumerate(ranked):
        contexts = _contexts(stream, j, model.tokenizer, n_contexts)
        chosen, rejected, diff, ci = read_sides(attribution, col[f])
        cards.append(FeatureCard(
            feature=f, layer=attribution.layer, score=score, score_kind=kind,
            alignment=float(attribution.latent_alignment[f]), write=direct_write(attribution, col[f]),
            frequency=float(stats.frequency[f]), contexts=contexts, chosen=chosen, rejected=rejected,
            difference=diff, difference_ci=ci,
            correlations=correlations(stream.seq_max[:, j].double().numpy(), checked),
            note="" if contexts else f"feature {f} never fired on the {len(source.seqs)} corpus sequences",
        ))
    return FeatureReport(
        layer=attribution.layer, score_kind=kind, cards=FeatureCards(attribution.layer, tuple(cards), tuple(checked)),
        fvu=stats.fvu, l0=stats.l0, dead_fraction=stats.dead_fraction, n_activations=stats.n_rows,
        positions=positions,
    )
