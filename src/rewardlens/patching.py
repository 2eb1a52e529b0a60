"""`patch`: activation patching between the chosen and the rejected response, exact and batched.

Sign convention: a part's `effect` is the clean chosen − rejected margin minus the patched margin.
Positive means the part carries the preference: in `noising` (run chosen, insert rejected's
activation) the chosen reward falls; in `denoising` (run rejected, insert chosen's) the rejected
reward rises; in `ablation` (zero, or the mean over a reference set, on both sides) the margin
shrinks. `estimand="total"` lets the patch flow through every later layer; `estimand="direct"`
holds every later part at its clean value and recomputes only the final norm's scale (path-frozen
patching: DESIGN.md §1), the causal twin of attribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .errors import DataError, TokenizationError
from .model.core import RewardModel
from .model.hooks import Point
from .model.tokens import Tokenized, collate, sequence_label
from .patch_direct import direct_rewards
from .patch_engine import (
    Site,
    batched_sweep,
    copies_supported,
    read_sweep,
    site_point,
    sites,
)
from .trace import trace

MODES = ("noising", "denoising", "ablation")
Spans = Sequence[tuple[int | None, int | None]]


@dataclass(frozen=True)
class Patching:
    """Patched rewards of every pair under every part's patch, and the effects they imply.

    `chosen`, `rejected` [n] are the clean rewards; `patched_chosen`, `patched_rejected` [n, P] the
    rewards with part p patched (equal to the clean reward on the side a mode leaves alone).
    `divergence` [n, P] (when asked for): how far the patched run's downstream residual stream left
    the natural one, as a ratio to the natural threshold (> 1: out of distribution).
    `approximate` is True for attribution patching (a first-order estimate, not a patched run).
    """

    names: list[str]
    chosen: np.ndarray
    rejected: np.ndarray
    patched_chosen: np.ndarray
    patched_rejected: np.ndarray
    mode: str
    positions: str
    level: str
    estimand: str
    pair_ids: list[str]
    divergence: np.ndarray | None = None
    approximate: bool = False
    min_margin: float = 1e-4

    @property
    def margin(self) -> np.ndarray:
        """Clean chosen − rejected margin [n]."""
        return self.chosen - self.rejected

    @property
    def effect(self) -> np.ndarray:
        """Clean margin − patched margin [n, P], in reward units."""
        return self.margin[:, None] - (self.patched_chosen - self.patched_rejected)

    @property
    def near_zero(self) -> np.ndarray:
        """Pairs whose clean margin is under `min_margin` [n] (no side to normalise by)."""
        return np.abs(self.margin) < self.min_margin

    @property
    def normalized(self) -> np.ndarray:
        """`effect / margin` [n, P] (1 = the part alone carries the whole margin); NaN on near-zero margins."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out = self.effect / self.margin[:, None]
        return np.where(self.near_zero[:, None], np.nan, out)

    @property
    def flagged(self) -> np.ndarray:
        """[n, P] bool: the patched run left the natural distribution (always False without divergence)."""
        if self.divergence is None:
            return np.zeros(self.patched_chosen.shape, dtype=bool)
        return self.divergence > 1.0

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The `n` parts with the largest mean |effect|, with their mean effect."""
        mean = self.effect.mean(0)
        return [(self.names[i], float(mean[i])) for i in np.argsort(-np.abs(mean))[:n]]

    def reliability(self) -> dict[str, float]:
        """How much of the result rests on out-of-distribution patched runs.

        `flagged_share`: share of (pair, part) runs flagged; `effect_share_flagged`: share of the
        total |effect| that comes from flagged runs; `top_flagged_share`: share of flagged runs
        among the ten parts with the largest mean |effect|. NaN without divergence scores.
        """
        if self.divergence is None:
            return {"flagged_share": np.nan, "effect_share_flagged": np.nan, "top_flagged_share": np.nan}
        size = np.abs(self.effect)
        top = [self.names.index(name) for name, _ in self.top(10)]
        return {
            "flagged_share": float(self.flagged.mean()),
            "effect_share_flagged": float(size[self.flagged].sum() / max(size.sum(), 1e-30)),
            "top_flagged_share": float(self.flagged[:, top].mean()),
        }

    def to_frame(self):
        """Long table: one row per (pair, part) with effect, normalised effect and divergence."""
        import pandas as pd

        n, p = self.effect.shape
        frame = pd.DataFrame({
            "pair": np.repeat(self.pair_ids, p), "part": np.tile(self.names, n), "effect": self.effect.ravel(),
            "normalized": self.normalized.ravel(), "patched_chosen": self.patched_chosen.ravel(),
            "patched_rejected": self.patched_rejected.ravel(),
        })
        if self.divergence is not None:
            frame["divergence"] = self.divergence.ravel()
            frame["flagged"] = self.flagged.ravel()
        return frame

    def plot(self, n: int = 20):
        """Bar chart of the mean effect of the top `n` parts (flagged share hatched when scored)."""
        import matplotlib.pyplot as plt

        top = self.top(n)
        fig, ax = plt.subplots(figsize=(6, 0.3 * len(top) + 1))
        ax.barh([t[0] for t in top][::-1], [t[1] for t in top][::-1])
        ax.set_xlabel(f"mean {self.estimand} effect on the margin ({self.mode}, {self.positions} positions)")
        fig.tight_layout()
        return fig


@dataclass
class Clean:
    """The clean run of every sequence at its read position: trace points [N, w], rewards, readout."""

    seqs: list[Tokenized]
    store: dict[str, Tensor]
    read: list[int]
    coef: Tensor
    reward: Tensor

    @classmethod
    def run(
        cls, model: RewardModel, seqs: list[Tokenized], *, heads: bool, batch_size: int, only: list[int] | None = None
    ) -> Clean:
        """Trace every sequence, or only those in `only`: the others get their read position and
        readout coefficients (no forward needed) but zero activations and a NaN reward, for the
        caller to fill in (the read-position engine reads them off an unpatched copy)."""
        index = list(range(len(seqs))) if only is None else list(only)
        layers = range(model.n_layers) if heads else ()
        parts: dict[str, list] = {}
        read = [0] * len(seqs)
        order = []
        for rows, batch in model.batches([seqs[i] for i in index], batch_size, "right", is_pairs=False):
            tr = trace(model, batch, heads=layers)
            for key, value in tr.store.items():
                parts.setdefault(key, []).append(value)
            for row, at in zip(rows.tolist(), batch.read_index.tolist()):
                read[index[row]] = at
            order.append(torch.as_tensor(rows))
        rest = [i for i in range(len(seqs)) if i not in set(index)]
        for rows, batch in model.batches([seqs[i] for i in rest], batch_size, "right", is_pairs=False):
            for row, at in zip(rows.tolist(), batch.read_index.tolist()):
                read[rest[row]] = at
        inverse = torch.argsort(torch.cat(order))
        run = {k: torch.cat(v)[inverse.to(v[0].device)] for k, v in parts.items()}
        values, coef = model.head_readout(run)
        if only is None:
            return cls(seqs, run, read, coef, (values * coef).sum(-1))
        at = torch.tensor(index, device=model.device)
        store = {k: v.new_zeros((len(seqs), *v.shape[1:])).index_copy(0, at, v) for k, v in run.items()}
        reward = torch.full((len(seqs),), float("nan"), device=model.device).index_copy(0, at, (values * coef).sum(-1))
        return cls(seqs, store, read, model.head.coefficients(len(seqs)), reward)


def _check(mode: str, ablation: str, estimand: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if ablation not in ("zero", "mean"):
        raise ValueError(f"ablation must be 'zero' or 'mean', got {ablation!r}")
    if estimand not in ("total", "direct"):
        raise ValueError(f"estimand must be 'total' or 'direct', got {estimand!r}")


def encode_pairs(model: RewardModel, pairs: object) -> list[Tokenized]:
    """Token ids of the pairs, interleaved chosen, rejected; refuses inputs that are not pairs."""
    seqs, is_pairs = model.encode(pairs)
    if not is_pairs:
        raise DataError("patching compares the two sides of preference pairs: pass a list of rewardlens.Pair")
    return seqs


def resolve_positions(
    seqs: list[Tokenized], read: list[int], targets: list[int], sources: list[int] | None, positions: str | Spans
) -> tuple[Tensor, Tensor, Tensor]:
    """Target columns, matching source columns and a validity mask, each [n_targets, m].

    'all' needs the two sides of a pair to have the same length (token-aligned). A span
    `(start, stop)` slices the positions up to and including the read token `t*`: negative numbers
    count back from `t*` (so `(-3, None)` is the last three tokens, aligned at the read token on
    both sides), others are absolute. Short rows repeat their last column (masked out in `valid`).
    """
    cols_t, cols_s = [], []
    for j, t in enumerate(targets):
        s = None if sources is None else sources[j]
        if positions == "all":
            if s is not None and len(seqs[t].ids) != len(seqs[s].ids):
                raise TokenizationError(
                    f"positions='all' needs token-aligned pairs, but {sequence_label(t, True)} has "
                    f"{len(seqs[t].ids)} tokens and {sequence_label(s, True)} has {len(seqs[s].ids)}; use "
                    "positions='read' (the default) or spans counted back from the read token, e.g. [(-4, None)]"
                )
            ct = list(range(len(seqs[t].ids)))
            cs = list(ct)
        else:
            ct = _span_cols(positions, read[t])
            cs = ct if s is None else _span_cols(positions, read[s])
            if len(cs) != len(ct) or not ct:
                raise TokenizationError(
                    f"the spans {list(positions)} select {len(ct)} positions in {sequence_label(t, True)} but "
                    f"{len(cs)} in {sequence_label(s, True) if s is not None else 'its source'}; count them back "
                    "from the read token (negative numbers) so both sides have them"
                )
        cols_t.append(ct)
        cols_s.append(cs)
    m = max(len(c) for c in cols_t)
    pad = lambda cs: [c + [c[-1]] * (m - len(c)) for c in cs]
    valid = torch.tensor([[i < len(c) for i in range(m)] for c in cols_t])
    return torch.tensor(pad(cols_t)), torch.tensor(pad(cols_s)), valid


def _span_cols(spans: Spans, read: int) -> list[int]:
    if isinstance(spans, str):
        raise ValueError(f"positions must be 'read', 'all' or a list of (start, stop) spans, got {spans!r}")
    cols: list[int] = []
    for span in spans:
        if len(span) != 2:
            raise ValueError(f"a span is (start, stop), got {span!r}")
        for c in range(read + 1)[slice(*span)]:
            if c not in cols:
                cols.append(c)
    return cols


def capture_columns(
    model: RewardModel, seqs: list[Tokenized], index: list[int], cols: Tensor, keys: dict[str, Site], batch_size: int
) -> dict[str, Tensor]:
    """Site activations of sequences `index` at columns `cols` [len(index), m] → key → [len(index), m, w]."""
    out: dict[str, list] = {k: [None] * len(index) for k in keys}
    chosen = [seqs[i] for i in index]
    for start in range(0, len(index), batch_size):
        rows = list(range(start, min(start + batch_size, len(index))))
        batch = collate([chosen[r] for r in rows], pad_id=model.pad_token_id, side="right", first=model.encoder,
                        device=model.device)
        c = cols[rows].to(model.device)
        points = {k: site_point(model, site, c) for k, site in keys.items()}
        if "embed" in points:
            points["embed"] = Point(model.layers[0], "in", c)
        store = model.run(batch, points)
        for k in keys:
            for j, r in enumerate(rows):
                out[k][r] = store[k][j]
    return {k: torch.stack(v) for k, v in out.items()}


def _keys(sweep: list[Site]) -> dict[str, Site]:
    return {site.key: site for site in sweep}


def _ablation_values(
    model: RewardModel, clean: Clean, sweep: list[Site], ablation: str, positions: str | Spans,
    reference: list[Tokenized] | None, batch_size: int,
) -> dict[str, Tensor]:
    """One replacement vector [w] per key: zeros, or the mean activation over the reference set
    (at its read positions for positions='read', else over every real token)."""
    keys = _keys(sweep)
    if ablation == "zero":
        return {k: torch.zeros_like(clean.store[k][0]) for k in keys}
    if positions == "read":
        if reference is None:
            return {k: clean.store[k].mean(0) for k in keys}
        ref = Clean.run(model, reference, heads=any(s.head is not None for s in sweep), batch_size=batch_size)
        return {k: ref.store[k].mean(0) for k in keys}
    ref_seqs = reference if reference is not None else clean.seqs
    index = list(range(len(ref_seqs)))
    cols, _, valid = resolve_positions(ref_seqs, [len(s.ids) - 1 for s in ref_seqs], index, None, [(0, None)])
    acts = capture_columns(model, ref_seqs, index, cols, keys, batch_size)
    weight = valid.to(model.device, torch.float32)[..., None]
    return {k: (v * weight).sum((0, 1)) / weight.sum() for k, v in acts.items()}


@dataclass(frozen=True)
class Plan:
    """Which runs a sweep patches and with what: target sequence indices, their patched columns
    [n_targets, m] and validity mask (None at the read position), and the replacement values per
    site key ([w] everywhere, [n_targets, w] at the read position, or [n_targets, m, w])."""

    targets: list[int]
    cols: Tensor | None
    valid: Tensor | None
    values: dict[str, Tensor]

    @classmethod
    def make(
        cls, model: RewardModel, clean: Clean, sweep: list[Site], mode: str, ablation: str, positions: str | Spans,
        reference: list[Tokenized] | None, batch_size: int,
    ) -> Plan:
        n_seqs = len(clean.seqs)
        if mode == "ablation":
            targets, sources = list(range(n_seqs)), None
        else:
            chosen, rejected = list(range(0, n_seqs, 2)), list(range(1, n_seqs, 2))
            targets, sources = (chosen, rejected) if mode == "noising" else (rejected, chosen)
        cols, cols_s, valid = (None, None, None) if positions == "read" else resolve_positions(
            clean.seqs, clean.read, targets, sources, positions)
        if mode == "ablation":
            values = _ablation_values(model, clean, sweep, ablation, positions, reference, batch_size)
        elif positions == "read":
            values = {k: clean.store[k][sources] for k in _keys(sweep)}
        else:
            values = capture_columns(model, clean.seqs, sources, cols_s, _keys(sweep), batch_size)
        return cls(targets, cols, valid, values)

    def at_columns(self, clean: Clean) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The plan with read positions written as columns: cols [n_targets, m], valid, values."""
        if self.cols is not None:
            return self.cols, self.valid, self.values
        cols = torch.tensor([[clean.read[i]] for i in self.targets])
        values = {k: v if v.ndim == 1 else v[:, None] for k, v in self.values.items()}
        return cols, torch.ones_like(cols, dtype=torch.bool), values


def patch(
    model: RewardModel,
    pairs: object,
    *,
    mode: str = "noising",
    ablation: str = "zero",
    positions: str | Spans = "read",
    level: str = "sublayer",
    estimand: str = "total",
    reference: object | None = None,
    divergence: bool = False,
    batch_size: int = 8,
    chunk: int = 512,
    min_margin: float = 1e-4,
) -> Patching:
    """Patch every part (`level` 'sublayer' or 'head') of every pair and return the patched rewards.

    `positions`: 'read' (only the read token; any two lengths), 'all' (token-aligned pairs) or
    spans (see `resolve_positions`). `reference`: inputs whose mean activation `ablation='mean'`
    inserts (default: both sides of `pairs`) and whose natural activations divergence is scored
    against. `divergence=True` scores how far each patched run's later residual stream leaves
    the natural distribution (`Patching.divergence`, `Patching.reliability`). `chunk`: patched
    copies of the read token per row in the read-position engine (memory grows with it).
    """
    _check(mode, ablation, estimand)
    if divergence and estimand == "direct":
        raise ValueError("divergence scores patched runs' later activations; estimand='direct' holds them "
                         "frozen, so there is nothing to score: use estimand='total'")
    seqs = encode_pairs(model, pairs)
    sweep = sites(model, level)
    # The read-position engine can read each target's clean reward off an unpatched copy, so the
    # clean trace need only cover the sequences whose activations are inserted.
    copies = estimand == "total" and positions == "read" and copies_supported(model, seqs) is None
    only = None
    if copies and not divergence and model.arch.head_kind != "gated" and mode != "ablation":
        only = list(range(1 if mode == "noising" else 0, len(seqs), 2))
    clean = Clean.run(model, seqs, heads=level == "head", batch_size=batch_size, only=only)
    ref_seqs = None if reference is None else model.encode(reference)[0]
    plan = Plan.make(model, clean, sweep, mode, ablation, positions, ref_seqs, batch_size)
    targets, cols_t, values = plan.targets, plan.cols, plan.values
    tgt = [seqs[i] for i in targets]
    labels = [sequence_label(i, True) for i in targets]
    streams = None
    if estimand == "direct":
        rewards = direct_rewards(model, clean, targets, sweep, values, cols_t)
    elif copies:
        rewards, streams = read_sweep(model, tgt, [clean.read[i] for i in targets], sweep, values,
                                      clean.coef[targets], batch_size=batch_size, chunk=chunk, resid=divergence,
                                      clean_copy=True)
        clean.reward[targets] = rewards[:, 0]
        rewards = rewards[:, 1:]
    else:
        cols_t, _, values = plan.at_columns(clean)
        rewards, streams = batched_sweep(model, tgt, sweep, cols_t, values, batch_size=batch_size,
                                         resid=divergence, labels=labels)
    scores = None
    if divergence:
        from .divergence import score_patched

        scores = score_patched(model, clean, ref_seqs, sweep, targets, streams, batch_size)
    return assemble(pairs, clean, targets, rewards, sweep, mode=mode, positions=positions, level=level,
                    estimand=estimand, divergence=scores, min_margin=min_margin)


def assemble(
    pairs: object, clean: Clean, targets: list[int], rewards: Tensor, sweep: list[Site], *, mode: str,
    positions: str | Spans, level: str, estimand: str, divergence: np.ndarray | None = None,
    approximate: bool = False, min_margin: float = 1e-4,
) -> Patching:
    """A `Patching` from the patched rewards [n_targets, S] of `targets` (other sequences keep their clean reward)."""
    patched = clean.reward[:, None].repeat(1, len(sweep))
    patched[targets] = rewards.to(patched.dtype)
    patched = patched.cpu().numpy()
    reward = clean.reward.cpu().numpy()
    ids = [getattr(p, "id", None) for p in pairs]
    return Patching(
        names=[s.name for s in sweep], chosen=reward[0::2], rejected=reward[1::2],
        patched_chosen=patched[0::2], patched_rejected=patched[1::2], mode=mode,
        positions=positions if isinstance(positions, str) else "spans", level=level, estimand=estimand,
        pair_ids=[str(i) if pid is None else str(pid) for i, pid in enumerate(ids)], divergence=divergence,
        approximate=approximate, min_margin=min_margin,
    )
