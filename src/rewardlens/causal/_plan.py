"""What a sweep patches: the clean runs, the positions, and the values inserted.

`Clean` traces every sequence once at its read position; `PatchPlan` turns a mode (noising,
denoising, ablation) and a position set (read, all, spans) into target rows, their columns and
the replacement activations. The engines (`patch_engine`, `patch_direct`) only execute plans.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..data import Pair, flatten_pairs, pair_of
from ..data.internal import rows_of
from ..errors import DataError, RewardLensWarning, TokenizationError, UsageError
from ..model import RewardModel, Trace, TraceKey, trace
from ..model.internal import Batch, Tokenized, sequence_label
from ..types import Ablation, Mode, Positions, Spans
from ._engine import Site, neuron_layers, site_point
from ._layerwise import Recorded


@dataclass
class Clean:
    """The clean run of every sequence at its read position: trace points [N, w], rewards, readout."""

    seqs: list[Tokenized]
    captured: dict[TraceKey, Tensor]
    read: list[int]
    coef: Tensor
    reward: Tensor
    recorded: Recorded | None = field(default=None, compare=False, repr=False)
    """The targets' layer inputs or caches, recorded by the same traced forward (`trace_pairs(record=)`):
    layer inputs until attribution patching's backward takes them, caches until the read-position sweep
    does (`Recorded`); None: not recorded."""

    @classmethod
    def run(
        cls, model: RewardModel, seqs: list[Tokenized], *, heads: bool, batch_size: int, only: list[int] | None = None,
        is_pairs: bool = True, neurons: Sequence[int] = (),
    ) -> Clean:
        """Trace every sequence, or only those in `only`: the others get their read position and
        readout coefficients (no forward needed) but zero activations and a NaN reward, for the
        caller to fill in (the read-position engine reads them off an unpatched copy). `heads`: keep every
        layer's heads; `neurons`: the layers whose MLP neurons to keep (`neuron_layers` of a sweep)."""
        index = list(range(len(seqs))) if only is None else list(only)
        layers = range(model.n_layers) if heads else ()
        runs = CleanRuns(len(index))
        for rows, batch in model.batches([seqs[i] for i in index], batch_size, "right", is_pairs, index=index):
            runs(rows, batch, trace(model, batch, heads=layers, neurons=neurons))
        if only is None:
            return cls.of(model, seqs, runs)
        read = [0] * len(seqs)
        for j, i in enumerate(index):
            read[i] = runs.read[j]
        rest = [i for i in range(len(seqs)) if i not in set(index)]
        for rows, batch in model.batches([seqs[i] for i in rest], batch_size, "right", is_pairs, index=rest):
            for row, at in zip(rows.tolist(), batch.read_index.tolist()):
                read[rest[row]] = at
        run = runs.captured()
        values, coef = model.head_readout(run)
        at = torch.tensor(index, device=model.device)
        captured = {k: v.new_zeros((len(seqs), *v.shape[1:])).index_copy(0, at, v) for k, v in run.items()}
        reward = torch.full((len(seqs),), float("nan"), device=model.device).index_copy(0, at, (values * coef).sum(-1))
        return cls(seqs, captured, read, model.head.coefficients(len(seqs)), reward)

    @classmethod
    def of(cls, model: RewardModel, seqs: list[Tokenized], runs: CleanRuns) -> Clean:
        """The clean runs of all of `seqs`, from traces already taken (`CleanRuns` saw every batch)."""
        run = runs.captured()
        values, coef = model.head_readout(run)
        return cls(seqs, run, runs.read, coef, (values * coef).sum(-1))


class CleanRuns:
    """Each traced batch's read-position captures and read positions, kept in the order of the
    sequences traced (batches come length-sorted): call it with `(rows, batch, trace)` per batch."""

    def __init__(self, n: int) -> None:
        self.parts: dict[TraceKey, list[Tensor]] = {}
        self.order: list[np.ndarray] = []
        self.read = [0] * n

    def __call__(self, rows: np.ndarray, batch: Batch, tr: Trace) -> None:
        for key, value in tr.captured.items():
            self.parts.setdefault(key, []).append(value)
        for row, at in zip(np.asarray(rows).tolist(), batch.read_index.tolist()):
            self.read[row] = at
        self.order.append(np.asarray(rows))

    def captured(self) -> dict[TraceKey, Tensor]:
        """Every point [N, w], rows in the order of the sequences traced."""
        inverse = torch.as_tensor(np.argsort(np.concatenate(self.order)))
        return {k: torch.cat(v)[inverse.to(v[0].device)] for k, v in self.parts.items()}


def encode_pairs(model: RewardModel, pairs: Pair | Sequence[Pair]) -> list[Tokenized]:
    """Token ids of the pairs, interleaved chosen, rejected; refuses inputs that are not pairs."""
    seqs, is_pairs = model.encode(pairs)
    if not is_pairs:
        raise DataError("patching compares the two sides of preference pairs: pass a list of rewardlens.Pair")
    return seqs


def pair_seqs(model: RewardModel, pairs: Pair | Sequence[Pair], clean: Clean | None) -> list[Tokenized]:
    """The pairs' token ids: those the clean runs were traced from when the caller passes them (so a
    chunk is tokenized once, by `trace_pairs`, for every estimand), else encoded here."""
    if clean is None:
        return encode_pairs(model, pairs)
    n = len(flatten_pairs(pairs))
    if len(clean.seqs) != 2 * n:
        raise UsageError(f"clean= holds the runs of {len(clean.seqs)} sequences but {n} pairs were passed "
                         f"({2 * n} sequences): pass the clean runs traced from these pairs "
                         "(trace_pairs(model, pairs).clean)")
    return clean.seqs


def resolve_positions(
    seqs: list[Tokenized], read: list[int], targets: list[int], sources: list[int] | None,
    positions: Positions | Spans,
) -> tuple[Tensor, Tensor, Tensor]:
    """Target columns, matching source columns and a validity mask, each [n_targets, m].

    'all' needs the two sides of a pair to have the same length (token-aligned). 'prefix' patches
    positions 0..min_len-1 on both sides, `min_len = min(len(chosen), len(rejected))` of the pair
    (aligned from the start, the seed paper's rule; the longer side's read token is left out). A span
    `(start, stop)` slices the positions up to and including the read token `t*`: negative numbers
    count back from `t*` (so `(-3, None)` is the last three tokens, aligned at the read token on
    both sides), others are absolute. Short rows repeat their last column (masked out in `valid`).
    """
    cols_t: list[list[int]] = []
    cols_s: list[list[int]] = []
    for j, t in enumerate(targets):
        s = None if sources is None else sources[j]
        if positions == "prefix":
            ct = list(range(min(len(seqs[t].ids), len(seqs[partner(t)].ids))))
            cs = list(ct)
        elif positions == "all":
            if s is not None and len(seqs[t].ids) != len(seqs[s].ids):
                raise TokenizationError(
                    f"positions='all' needs token-aligned pairs, but {sequence_label(t, True)} has "
                    f"{len(seqs[t].ids)} tokens and {sequence_label(s, True)} has {len(seqs[s].ids)}; use "
                    "positions='read' (the default) or spans counted back from the read token, e.g. [(-4, None)]",
                    option="positions"
                )
            ct = list(range(len(seqs[t].ids)))
            cs = list(ct)
        else:
            ct = _span_cols(positions, read[t])
            cs = ct if s is None else _span_cols(positions, read[s])
            if not ct:
                raise TokenizationError(
                    f"the spans {list(positions)} select no position in {sequence_label(t, True)}, whose read token "
                    f"is position {read[t]}: a span (start, stop) slices the positions 0 to {read[t]}; pass spans "
                    "inside them, e.g. counted back from the read token such as [(-4, None)]")
            if len(cs) != len(ct):
                raise TokenizationError(
                    f"the spans {list(positions)} select {len(ct)} positions in {sequence_label(t, True)} but "
                    f"{len(cs)} in {sequence_label(s, True) if s is not None else 'its source'}; count them back "
                    "from the read token (negative numbers) so both sides have them"
                )
        cols_t.append(ct)
        cols_s.append(cs)
    m = max(len(c) for c in cols_t)

    def pad(cs: list[list[int]]) -> list[list[int]]:
        return [c + [c[-1]] * (m - len(c)) for c in cs]

    valid = torch.tensor([[i < len(c) for i in range(m)] for c in cols_t])
    return torch.tensor(pad(cols_t)), torch.tensor(pad(cols_s)), valid


def partner(row: int) -> int:
    """The other side of `row`'s pair (the row layout is `rewardlens.data`'s: `pair_of`, `rows_of`)."""
    pair, which = pair_of(row)
    return rows_of(pair)[1 if which == "chosen" else 0]


def unpatched_read(seqs: list[Tokenized], read: list[int], targets: list[int]) -> list[int]:
    """Pairs (indices) in which positions='prefix' leaves a target's read token unpatched: the
    target is longer than its partner, so `t*` ≥ min_len."""
    return sorted({pair_of(t)[0] for t in targets if read[t] >= min(len(seqs[t].ids), len(seqs[partner(t)].ids))})


def warn_unpatched_read(pairs: list[int], ids: Sequence[str] | None) -> None:
    """One warning naming the pairs whose read token positions='prefix' leaves unpatched."""
    if not pairs:
        return
    names = [ids[i] if ids is not None else str(i) for i in pairs]
    shown = ", ".join(names[:20]) + (f", ... ({len(names) - 20} more)" if len(names) > 20 else "")
    warnings.warn(
        f"positions='prefix' leaves the read token unpatched in {len(names)} pair(s) (ids: {shown}): the patched "
        "side is longer than the other, so its read token lies past the shared prefix of min(len(chosen), "
        "len(rejected)) tokens and a patch reaches the reward only through earlier positions; use "
        "positions='read' to patch the read token itself", RewardLensWarning, stacklevel=4)


def _span_cols(spans: str | Spans, read: int) -> list[int]:
    if isinstance(spans, str):
        raise UsageError(f"positions must be 'read', 'all', 'prefix' or a list of (start, stop) spans, got {spans!r}",
                         option="positions")
    cols: list[int] = []
    for span in spans:
        if len(span) != 2:
            raise UsageError(f"a span is (start, stop), got {span!r}", option="positions")
        for c in range(read + 1)[slice(*span)]:
            if c not in cols:
                cols.append(c)
    return cols


def unchanged_prefix(
    seqs: list[Tokenized], read: list[int], targets: list[int], sources: list[int] | None, cols_t: Tensor,
    cols_s: Tensor, valid: Tensor,
) -> list[int]:
    """Per target, the first position whose patched value can differ from its clean one in a causal
    decoder, at most its read token: the first valid column that inserts something other than the
    source's activation at the same column of a shared token prefix. Where a target and its source begin
    with the same c tokens, a causal decoder computes the same activations at positions < c in both
    (right-padded, positions counted from 0), so inserting the source's value there changes nothing.
    Ablation (no source) changes every column it patches."""
    out = []
    for j, t in enumerate(targets):
        shared = 0
        if sources is not None:
            a, b = seqs[t].ids, seqs[sources[j]].ids
            shared = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        ct, cs = cols_t[j][valid[j]], cols_s[j][valid[j]]
        changes = ct[(ct != cs) | (ct >= shared)]
        out.append(min(int(changes.min()) if len(changes) else read[t], read[t]))
    return out


def capture_columns(
    model: RewardModel, seqs: list[Tokenized], index: list[int], cols: Tensor, keys: dict[TraceKey, Site],
    batch_size: int, *, is_pairs: bool = True,
) -> dict[TraceKey, Tensor]:
    """Site activations of sequences `index` at columns `cols` [len(index), m] → key → [len(index), m, w]."""
    out: dict[TraceKey, list[Tensor]] = {k: [] for k in keys}
    order: list[Tensor] = []
    for rows, batch in model.batches([seqs[i] for i in index], batch_size, "right", is_pairs, index=index):
        points = {k: site_point(model, site, cols[rows].to(model.device)) for k, site in keys.items()}
        captured = model.run(batch, points)
        for k in keys:
            out[k].append(captured[k])
        order.append(torch.as_tensor(rows))
    inverse = torch.argsort(torch.cat(order))
    return {k: torch.cat(v)[inverse.to(v[0].device)] for k, v in out.items()}


def _by_key(sweep: list[Site]) -> dict[TraceKey, Site]:
    return {site.key: site for site in sweep}


def _ablation_values(
    model: RewardModel, clean: Clean, sweep: list[Site], ablation: Ablation, positions: Positions | Spans,
    reference: list[Tokenized] | None, batch_size: int,
) -> dict[TraceKey, Tensor]:
    """One replacement vector [w] per key: zeros, or the mean activation over the reference set
    (at its read positions for positions='read', else over every real token)."""
    keys = _by_key(sweep)
    if ablation == "zero":
        return {k: torch.zeros_like(clean.captured[k][0]) for k in keys}
    if positions == "read":
        if reference is None:
            return {k: clean.captured[k].mean(0) for k in keys}
        ref = Clean.run(model, reference, heads=any(s.head is not None for s in sweep), batch_size=batch_size,
                        is_pairs=False, neurons=neuron_layers(sweep))
        return {k: ref.captured[k].mean(0) for k in keys}
    ref_seqs = reference if reference is not None else clean.seqs
    index = list(range(len(ref_seqs)))
    cols, _, valid = resolve_positions(ref_seqs, [len(s.ids) - 1 for s in ref_seqs], index, None, [(0, None)])
    acts = capture_columns(model, ref_seqs, index, cols, keys, batch_size, is_pairs=reference is None)
    weight = valid.to(model.device, torch.float32)[..., None]
    return {k: (v * weight).sum((0, 1)) / weight.sum() for k, v in acts.items()}


def sides(mode: Mode, n_seqs: int) -> tuple[list[int], list[int] | None]:
    """(targets, sources) of a patch in `mode` over `n_seqs` sequences (pairs interleaved chosen, rejected):
    noising patches the chosen sides from the rejected, denoising the reverse, ablation every side (no source)."""
    if mode == "ablation":
        return list(range(n_seqs)), None
    rows = [rows_of(pair) for pair in range(n_seqs // 2)]
    chosen, rejected = [c for c, _ in rows], [r for _, r in rows]
    return (chosen, rejected) if mode == "noising" else (rejected, chosen)


def sources_only(model: RewardModel, mode: Mode, n_seqs: int) -> list[int] | None:
    """What a clean trace must cover when another pass gives the targets' clean values (an engine's own
    forward, a gradient pass): the sources (`sides`); None, every sequence, where it cannot be so: ablation
    patches every side, and a gate's coefficients move with the input."""
    if model.arch.head_kind == "gated" or mode == "ablation":
        return None
    return sides(mode, n_seqs)[1]


@dataclass(frozen=True)
class PatchPlan:
    """Which runs a sweep patches and with what: target sequence indices, their patched columns
    [n_targets, m] and validity mask (None at the read position), and the replacement values per
    site key ([w] everywhere, [n_targets, w] at the read position, or [n_targets, m, w])."""

    targets: list[int]
    cols: Tensor | None
    valid: Tensor | None
    values: dict[TraceKey, Tensor]
    unchanged: list[int] | None = None
    """Per target, how many leading positions no edit changes in a causal decoder (`unchanged_prefix`);
    None at the read position."""

    @classmethod
    def make(
        cls, model: RewardModel, clean: Clean, sweep: list[Site], mode: Mode, ablation: Ablation,
        positions: Positions | Spans, reference: list[Tokenized] | None, batch_size: int, *,
        ids: Sequence[str] | None = None,
    ) -> PatchPlan:
        """`ids`: the pairs' ids, for the warning positions='prefix' gives (default: pair numbers)."""
        targets, sources = sides(mode, len(clean.seqs))
        cols = cols_s = valid = None
        if positions != "read":
            cols, cols_s, valid = resolve_positions(clean.seqs, clean.read, targets, sources, positions)
        if positions == "prefix":
            warn_unpatched_read(unpatched_read(clean.seqs, clean.read, targets), ids)
        if mode == "ablation":
            values = _ablation_values(model, clean, sweep, ablation, positions, reference, batch_size)
        elif cols_s is None:  # the read position
            values = {k: clean.captured[k][sources] for k in _by_key(sweep)}
        else:
            assert sources is not None  # noising and denoising take every target's values from a source
            values = capture_columns(model, clean.seqs, sources, cols_s, _by_key(sweep), batch_size)
        unchanged = None
        if cols is not None and cols_s is not None and valid is not None:
            unchanged = unchanged_prefix(clean.seqs, clean.read, targets, sources, cols, cols_s, valid)
        return cls(targets, cols, valid, values, unchanged)

    def at_columns(self, clean: Clean) -> tuple[Tensor, Tensor, dict[TraceKey, Tensor]]:
        """The plan with read positions written as columns: cols [n_targets, m], valid, values."""
        if self.cols is not None:
            assert self.valid is not None  # make() sets columns and their mask together
            return self.cols, self.valid, self.values
        cols = torch.tensor([[clean.read[i]] for i in self.targets])
        values = {k: v if v.ndim == 1 else v[:, None] for k, v in self.values.items()}
        return cols, torch.ones_like(cols, dtype=torch.bool), values
