"""Patching a reward read at a set of positions (a PRM's steps, a DPO reward's response tokens).

With several reads per sequence, "the read position" becomes the set of reads: a noising patch
writes, at the k-th read of the chosen side, what the site wrote at the k-th read of the rejected
side (denoising the reverse), and reads the patched run's own combined reward (its steps
re-combined; a `min` picks its minimum again). Pairs whose two sides have different numbers of
reads have no k-th-to-k-th map and are refused. Zero ablation needs no map: it writes zeros at
every read. Each patched run starts at its patched layer (`stepped_sweep`; whole forwards by
`batched_sweep` where layers cannot be stepped), so this equals a naive one-forward-per-part loop;
pairs are swept `batch_size` at a time, so the inserted activations held at once stay
[batch_size, reads, width] per site. Path-frozen (direct) patching needs no forward beyond the
clean traces: each read's final residual moves by the site's change alone (`patched_final`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ..data import Pair, chosen, rejected
from ..errors import DataError, UsageError, warn
from ..model import RewardModel, Trace, TraceKey, trace
from ..model.internal import Tokenized, collate, sequence_label
from ..types import Ablation, Mode, PatchLevel, Positions, Spans
from ._direct import patched_final
from ._engine import Site, batched_sweep
from ._plan import Clean, partner, sides
from ._stepped import stepped_sweep


def check_reads_options(mode: Mode, ablation: Ablation, positions: Positions | Spans, divergence: bool) -> None:
    """Refuse the options a multi-position read-out does not take (yet), naming what to pass instead."""
    if not isinstance(positions, str) or positions != "read":
        raise UsageError(f"positions={positions!r}: a reward read at a set of positions is patched at that set; "
                         "pass positions='read'", option="positions")
    if divergence:
        raise UsageError("divergence scores read one token per sequence; patch a multi-position read-out without "
                         "them (leave divergence off)", option="divergence")
    if mode == "ablation" and ablation != "zero":
        raise UsageError("a multi-position read-out takes mode='ablation' with ablation='zero' only for now",
                         option="mode")


def patch_mode(model: RewardModel, pairs: Sequence[Pair], seqs: Sequence[Tokenized] | None = None) -> Mode:
    """The mode an audit patches in: noising, unless the reward is read at a set of positions and some
    pair's sides are read at different numbers of them (a DPO reward's responses of two lengths): no
    read of one side then maps to one of the other, and zero ablation at every read is what is defined.
    `seqs`: the pairs' token ids (`encode_pairs`) when the caller has them."""
    if not model.reads.multi:
        return "noising"
    counts = model.read_counts(list(pairs)) if seqs is None else [1 if s.reads is None else len(s.reads) for s in seqs]
    per_row = np.asarray(counts)
    return "noising" if np.array_equal(chosen(per_row), rejected(per_row)) else "ablation"


def mode_for(model: RewardModel, pairs: Sequence[Pair], mode: Mode | None, seqs: Sequence[Tokenized]) -> Mode:
    """`mode` as given; None (the instruments' default): `patch_mode`, with a warning when that is zero
    ablation, so a reward read at a set of positions is patched wherever one of its pairs has no map."""
    if mode is not None:
        return mode
    chosen = patch_mode(model, pairs, seqs)
    if chosen == "ablation":
        warn("some pairs' two sides are read at different numbers of positions (a DPO reward's responses of two "
             "lengths, PRM answers with different step counts), so no read maps to one of the other: patching by "
             "zero ablation at every read, as the audit does; pass mode= to choose")
    return chosen


def matched_reads(seqs: list[Tokenized], mode: Mode) -> None:
    """Refuse pairs whose sides have different numbers of reads (no k-th-to-k-th map)."""
    if mode == "ablation":
        return
    bad = [(i // 2, len(seqs[i].reads or ()), len(seqs[i + 1].reads or ())) for i in range(0, len(seqs), 2)
           if len(seqs[i].reads or ()) != len(seqs[i + 1].reads or ())]
    if bad:
        shown = "; ".join(f"pair {p}: {a} on chosen, {b} on rejected" for p, a, b in bad[:5])
        raise DataError(
            f"{len(bad)} pair(s) read the reward at different numbers of positions ({shown}), so no read of one "
            "side maps to one of the other; patch pairs with as many steps on both sides, or use "
            "mode='ablation' (zero at every read)")


def traced_reads(model: RewardModel, seqs: list[Tokenized], index: list[int], heads: bool,
            batch_size: int, neurons: bool = False) -> tuple[dict[int, dict[TraceKey, Tensor]], dict[int, float]]:
    """Each sequence's captures at its reads {i: {key: [m_i, w]}} and its combined reward {i: r}; with every
    layer's heads (`heads`) or MLP neurons (`neurons`) too."""
    layers = range(model.n_layers) if heads else ()
    acts: dict[int, dict[TraceKey, Tensor]] = {}
    reward: dict[int, float] = {}
    for rows, batch in model.batches([seqs[i] for i in index], batch_size, "right", True, index=index):
        tr = trace(model, batch, heads=layers, neurons=range(model.n_layers) if neurons else ())
        values, coef = model.head_readout(tr.captured, batch)
        scores = (values * coef).sum(-1)
        fold = model.fold(batch, scores)
        assert batch.reads is not None and fold is not None  # a multi-position model's batches carry reads
        per = fold @ scores
        read_rows = batch.reads.rows
        for j, row in enumerate(np.asarray(rows).tolist()):
            mine = torch.nonzero(read_rows == j)[:, 0]
            acts[index[row]] = {k: v[mine.to(v.device)] for k, v in tr.captured.items()}
            reward[index[row]] = float(per[j])
    return acts, reward


def _stack(per: list[Tensor], width: int) -> Tensor:
    """Per-sequence [m_i, ...] → [n, width, ...], short ones padded by repeating their last read."""
    return torch.stack([torch.cat([x, x[-1:].expand(width - len(x), *x.shape[1:])]) for x in per])


class ReadChunks:
    """A sweep at the set of reads, `batch_size` pairs at a time: iterating yields each chunk's first
    target number, its targets (the patched sides), their sources (the other side of each pair) and
    both sides' captures at their reads; `clean_runs()` then holds every side's clean reward."""

    def __init__(self, model: RewardModel, seqs: list[Tokenized], mode: Mode, level: PatchLevel,
                 batch_size: int) -> None:
        matched_reads(seqs, mode)
        self.model, self.seqs, self.heads, self.batch_size = model, seqs, level == "head", batch_size
        self.level = level
        # Ablation patches both sides, as it does at one read token (docs/patching.md); noising the chosen
        # side, denoising the rejected one.
        self.targets = sides(mode, len(seqs))[0]
        self.clean = torch.zeros(len(seqs))

    def __iter__(self) -> Iterator[tuple[int, list[int], list[int], dict[int, dict[TraceKey, Tensor]]]]:
        for lo in range(0, len(self.targets), self.batch_size):
            tgt = self.targets[lo:lo + self.batch_size]
            src = [partner(t) for t in tgt]
            acts, reward = traced_reads(self.model, self.seqs, sorted({*tgt, *src}), self.heads, self.batch_size,
                                        self.level == "neuron")
            for i, r in reward.items():
                self.clean[i] = r
            yield lo, tgt, src, acts

    def clean_runs(self) -> Clean:
        """Every side's clean reward, as the `Clean` that `assemble` reads."""
        n, device = len(self.seqs), self.model.device
        return Clean(self.seqs, {}, [0] * n, self.model.head.coefficients(n), self.clean.to(device))


def direct_reads(
    model: RewardModel, seqs: list[Tokenized], sweep: list[Site], *, mode: Mode, level: PatchLevel,
    batch_size: int,
) -> tuple[Clean, list[int], Tensor]:
    """Path-frozen patching at the set of reads, from the traces alone: at each read of a target, the
    site's write is the source's k-th read's (zero for ablation) and every later part keeps its clean
    value; the final norm's scale is recomputed per read, and the reads are recombined as the patched
    run's own (a `min` picks again). No forward beyond the clean traces."""
    chunks = ReadChunks(model, seqs, mode, level, batch_size)
    rewards = torch.zeros(len(chunks.targets), len(sweep))
    for lo, tgt, src, acts in chunks:
        tr = Trace(None, {k: torch.cat([acts[t][k] for t in tgt]) for k in acts[tgt[0]]})
        batch = collate([seqs[t] for t in tgt], pad_id=model.pad_token_id, side="right", first=False,
                        device=model.device)
        coef = model.coefficients(tr.captured)
        for j, site in enumerate(sweep):
            rep = torch.zeros_like(tr[site.key]) if mode == "ablation" else torch.cat([acts[s][site.key] for s in src])
            values = model.head_values(model.final_hidden(patched_final(model, tr, site, rep)), batch)
            scores = (values * coef).sum(-1)
            fold = model.fold(batch, scores)
            assert fold is not None  # a multi-position model's batches carry their reads
            rewards[lo:lo + len(tgt), j] = (fold @ scores).cpu()
    return chunks.clean_runs(), chunks.targets, rewards.to(model.device)


def patch_reads(
    model: RewardModel, seqs: list[Tokenized], sweep: list[Site], *, mode: Mode, level: PatchLevel,
    batch_size: int,
) -> tuple[Clean, list[int], Tensor]:
    """`patch` for a multi-position read-out (module docstring): the clean runs' rewards, the patched
    sequences and their patched rewards [n_targets, S] (for `assemble`)."""
    chunks = ReadChunks(model, seqs, mode, level, batch_size)
    rewards = torch.zeros(len(chunks.targets), len(sweep))
    keys = list(dict.fromkeys(site.key for site in sweep))  # each key once, in sweep order
    for lo, tgt, src, acts in chunks:
        width = max(len(seqs[t].reads or ()) for t in tgt)
        cols = _stack([torch.tensor(seqs[t].reads or ()) for t in tgt], width)
        if mode == "ablation":
            values = {k: torch.zeros(acts[tgt[0]][k].shape[-1], device=model.device) for k in keys}
        else:
            values = {k: _stack([acts[s][k] for s in src], width) for k in keys}
        labels, targets = [sequence_label(t, True) for t in tgt], [seqs[t] for t in tgt]
        # Each run from its own layer where stepping reproduces the model; else whole forwards.
        got = stepped_sweep(model, targets, sweep, cols, values, batch_size=batch_size, labels=labels, index=tgt)
        if got is None:
            got, _ = batched_sweep(model, targets, sweep, cols, values, batch_size=batch_size, labels=labels, index=tgt)
        rewards[lo:lo + len(tgt)] = got.cpu()
    return chunks.clean_runs(), chunks.targets, rewards.to(model.device)
