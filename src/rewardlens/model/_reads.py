"""Where a reward is read: one token (a sequence-classification RM), or a set of positions combined.

A process reward model scores every reasoning step (its head read at each step separator); an
implicit DPO reward sums a log-probability over every response token. Both are read at a *set* of
positions `t_1 … t_K` of one sequence and combined,

    r = Σ_k α_k r_k,      r_k = u_k · norm(h_{t_k}) + c_k,

with `α` = 1 (sum), 1/K (mean), one-hot at the last read (last) or at the lowest step score on this
input (min: the selection is frozen at its value on this input, as a norm's scale is). A response
whose last step does not end with the separator has the separator appended to it (`Reads.final`),
as PRMs are trained with a step tag after every step, the last included. Every
weight is fixed once the forward has run, so the decomposition of each `r_k` folds into the
sequence's exactly. Reads are rows of their own in a trace ("read rows"); `ReadSet` maps them to
their batch rows, positions and steps (docs/design.md §1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import torch
from torch import Tensor

from ..errors import HeadError, TokenizationError, UsageError, warn
from ..types import Truncation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ReadAt = Literal["last", "separator", "response"]
"""Where a reward is read: Hugging Face's read token, every step separator in the response, or every
response token's prediction (an LM read-out of the token that follows)."""
Combine = Literal["sum", "mean", "min", "last"]
"""How the reads of one sequence make its reward."""
LastStep = Literal["append", "last-token", "ignore"]
"""How a response's last step is read when it does not end with the separator."""
READ_AT: tuple[ReadAt, ...] = get_args(ReadAt)
COMBINES: tuple[Combine, ...] = get_args(Combine)
LAST_STEPS: tuple[LastStep, ...] = get_args(LastStep)


@dataclass(frozen=True)
class Reads:
    """Where a `RewardModel` reads its reward, and how several reads make one number."""

    at: ReadAt = "last"
    """'last' (one read token, as today), 'separator' or 'response' (a set of positions)."""
    separator: str | int | None = None
    """The step separator for `at='separator'`: a string that is one token, or a token id."""
    combine: Combine = "sum"
    """How the per-read scores make the sequence's reward: sum, mean, min or last."""
    final: LastStep = "append"
    """A last step without its separator: 'append' one (as PRMs are trained), read 'last-token', or 'ignore' (warns)."""

    def __post_init__(self) -> None:
        if self.at not in READ_AT:
            raise UsageError(f"Reads.at must be one of {READ_AT}, got {self.at!r}")
        if self.combine not in COMBINES:
            raise UsageError(f"Reads.combine must be one of {COMBINES}, got {self.combine!r}")
        if (self.at == "separator") != (self.separator is not None):
            raise UsageError(
                f"Reads(at={self.at!r}, separator={self.separator!r}): a separator is given exactly when "
                "at='separator'; pass the step-separator token (text or id) with at='separator'")
        if self.final not in LAST_STEPS or (self.final != "append" and self.at != "separator"):
            raise UsageError(
                f"Reads(at={self.at!r}, final={self.final!r}): final says how a process reward model's last step "
                f"is read, one of {LAST_STEPS}, with at='separator' only; leave it at 'append' otherwise")

    @property
    def multi(self) -> bool:
        """Whether the reward is read at a set of positions rather than one token."""
        return self.at != "last"

    def separator_id(self, tokenizer: PreTrainedTokenizerBase) -> int:
        """The separator's token id; a string must be exactly one token of `tokenizer`."""
        if isinstance(self.separator, int):
            return self.separator
        ids = tokenizer.encode(str(self.separator), add_special_tokens=False)
        if len(ids) != 1:
            raise HeadError(
                f"the step separator {self.separator!r} is {len(ids)} tokens {ids} for this tokenizer, not one; "
                "pass the id of the token the PRM was trained to score at (Reads(separator=<id>))")
        return int(ids[0])

    def open_end(self, ids: list[int], prompt_length: int, separator: int | None, suffix: int = 0) -> bool:
        """Whether the response (`ids[prompt_length:len(ids) - suffix]`, `positions`' span) has tokens after
        its last separator: a last step that no separator closes."""
        end = len(ids) - suffix
        return self.at == "separator" and end > prompt_length and ids[end - 1] != separator

    def closed(
        self, ids: list[int], prompt_length: int, separator: int | None, suffix: int, label: str,
        limit: tuple[int | None, Truncation] = (None, "error"),
    ) -> tuple[list[int], int]:
        """(`ids`, `prompt_length`) with the separator inserted after the response's last token (before the
        template's end of turn) when `final='append'` and the last step is open (`open_end`). `limit`: the
        model's (max_length, truncation): a sequence the separator takes over max_length is refused unless
        truncation='left', in which case the caller cuts it as any input is cut (`fit_length`)."""
        if self.final != "append" or not self.open_end(ids, prompt_length, separator, suffix):
            return ids, prompt_length
        assert separator is not None  # open_end holds for separator reads only
        end, (max_length, truncation) = len(ids) - suffix, limit
        closed = [*ids[:end], separator, *ids[end:]]
        if max_length is not None and len(closed) > max_length and truncation != "left":
            raise TokenizationError(
                f"{label} has {len(ids)} tokens, the limit, before the separator closing its last step is appended; "
                "raise max_length=, end the response with the separator, or pass truncation='left'",
                option="max_length")
        return closed, prompt_length

    def positions(
        self, ids: list[int], prompt_length: int, separator: int | None, label: str, suffix: int = 0
    ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """(read positions, target ids or None) of one sequence of token `ids` whose response starts at
        `prompt_length` and whose last `suffix` tokens are the chat template's end of turn (no step
        ends there). 'response' reads position t for the token at t+1 (a log-probability), end of turn
        included, as DPO trains on it. With `final='last-token'` an open last step (`open_end`) is read at
        its last token; `closed` has already appended its separator for 'append'."""
        if self.at == "separator":
            where = tuple(t for t in range(prompt_length, len(ids) - suffix) if ids[t] == separator)
            if self.final == "last-token" and self.open_end(ids, prompt_length, separator, suffix):
                where = (*where, len(ids) - suffix - 1)
            if not where:
                raise TokenizationError(
                    f"{label} has no step separator (token {separator}) in its response and no open last step "
                    f"read under Reads(final={self.final!r}); give the response a step, ended with the separator")
            return where, None
        where = tuple(range(max(prompt_length - 1, 0), len(ids) - 1))
        if not where:
            raise TokenizationError(f"{label} has no response token to read a log-probability of")
        return where, tuple(ids[t + 1] for t in where)


@dataclass(frozen=True)
class ReadSet:
    """The reads of one padded batch, one per read row: `rows` [m] (the batch row), `cols` [m] (the
    position in the padded batch), `steps` [m] (the read's index within its sequence), `targets` [m]
    (the token whose log-probability is read, or None) and `offsets` [m] (a constant per read, e.g. a
    DPO reference's term, or None)."""

    rows: Tensor
    cols: Tensor
    steps: Tensor
    targets: Tensor | None
    offsets: Tensor | None

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    def weights(self, n_rows: int, scores: Tensor, combine: Combine) -> Tensor:
        """The fold [n_rows, m]: α of each read for its row, given the per-read scores [m]."""
        m, device = self.size, scores.device
        rows = self.rows.to(device)
        fold = torch.zeros(n_rows, m, dtype=torch.float32, device=device)
        pick = torch.arange(m, device=device)
        if combine in ("sum", "mean"):
            fold[rows, pick] = 1.0
            if combine == "mean":
                fold = fold / fold.sum(1, keepdim=True).clamp_min(1.0)
            return fold
        key = -scores.float() if combine == "min" else self.steps.to(device).float()
        best = torch.full((n_rows,), float("-inf"), device=device).scatter_reduce(0, rows, key, "amax")
        chosen = key == best[rows]
        first = torch.zeros(n_rows, dtype=torch.long, device=device).scatter_reduce(
            0, rows, torch.where(chosen, pick, m), "amin", include_self=False)
        fold[torch.arange(n_rows, device=device), first] = 1.0  # ties: the earliest read
        return fold


def warn_unscored(labels: list[str], total: int) -> None:
    """Say once that `Reads(final='ignore')` left the open last step of the sequences `labels` (of `total`) unscored."""
    if labels:
        shown = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
        warn(f"{len(labels)} of {total} responses end without the step separator ({shown}); Reads(final='ignore') "
             "leaves their last step unscored; pass final='append' (the default) to score it as PRMs are trained")


def one_read_only(what: str = "this instrument") -> HeadError:
    """The error an instrument that reads one token per sequence gives a multi-position read-out."""
    return HeadError(
        f"{what} reads the reward at one token per sequence, but the model reads it at a set of positions (a "
        "process reward model's steps or a DPO reward's response tokens); instruments that take such models: "
        "score, attribute, lens, patch, attribution_patch, faithfulness and the audit (docs/rm-kinds.md)")


def collate_reads(
    reads: list[tuple[tuple[int, ...], tuple[int, ...] | None, tuple[float, ...] | None]], shifts: list[int],
    device: torch.device,
) -> ReadSet:
    """One batch's `ReadSet` from each row's (positions, targets, offsets) and its padding shift."""
    rows = [r for r, (where, _, _) in enumerate(reads) for _ in where]
    cols = [t + shifts[r] for r, (where, _, _) in enumerate(reads) for t in where]
    steps = [k for where, _, _ in reads for k in range(len(where))]
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    targets = None if reads[0][1] is None else as_long([y for _, ys, _ in reads for y in ys or ()])
    offsets = None if reads[0][2] is None else torch.tensor(
        [o for _, _, os in reads for o in os or ()], dtype=torch.float32, device=device)
    return ReadSet(as_long(rows), as_long(cols), as_long(steps), targets, offsets)


READ_LAST = Reads()
"""One read token per sequence: a sequence-classification reward model."""
