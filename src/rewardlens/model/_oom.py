"""CUDA out-of-memory back-off: the one place where a batch too large for the device is split.

Every instrument's batch loop goes through here. `RewardModel.batches` forms its batches with
`batch_loop` and `RewardModel.run` (the read loop, the trace behind decompose, attribute and lens)
runs its forward through `run_rows`; the patch engines, whose forwards are their own, run each
batch with `each_batch`. On an out-of-memory error the batch is halved and retried, recursively,
down to one row, and the loop's later batches keep the smaller size; one warning names the new
size. A row that does not fit even alone is skipped: the loop runs to its end and then raises
`rewardlens.errors.OutOfMemoryError`, which names every skipped row (`.rows`, `.pairs`, `.labels`),
so none is lost silently and a caller can drop them and run again.
"""

from __future__ import annotations

import dataclasses
import gc
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from torch import Tensor

from ..data import pair_of
from ..data.internal import batch_work, metered, part
from ..errors import OutOfMemoryError, RewardLensWarning
from ._hooks import Point, PointKey, capture, eval_mode
from ._tokens import Batch, sequence_label

if TYPE_CHECKING:
    from ._backbone import Backbone

T = TypeVar("T")

OOM_ERRORS: tuple[type[BaseException], ...] = tuple(dict.fromkeys(
    kind for kind in (getattr(torch, "OutOfMemoryError", None), torch.cuda.OutOfMemoryError) if kind is not None))
"""What an accelerator raises when an allocation fails (`torch.OutOfMemoryError` where torch has it)."""


PAD_SLACK = 0.25
"""How much padding a length-sorted batch may add over its real tokens before it is cut."""


def _unpadded_run(rows: list[int], lengths: Sequence[int]) -> list[int]:
    """The longest prefix of `rows` (ascending length) whose padded size stays within the slack."""
    total = 0
    for k, row in enumerate(rows):
        total += lengths[row]
        if k and (k + 1) * lengths[row] > (1 + PAD_SLACK) * total:
            return rows[:k]
    return rows


class Backoff:
    """One batch loop's memory state: the batch size that fits so far, and the rows that fit in none.

    Rows are the loop's own numbers; `ids[row]` is that row's number in the caller's input (the
    sequence numbers `sequence_label` and `OutOfMemoryError.rows` use), `row` itself without `ids`.
    """

    def __init__(self, size: int, *, ids: Sequence[int] | None = None, is_pairs: bool = False,
                 labels: Sequence[str] | None = None) -> None:
        self.size, self.ids, self.is_pairs, self.labels = size, ids, is_pairs, labels
        self.skipped: list[int] = []
        self.said = False
        self.widths: dict[Hashable, int] = {}
        """Width of every point `run_rows` captured (to fill the rows of a piece that failed)."""

    def chunks(self, order: Sequence[int] | np.ndarray, lengths: Sequence[int] | None = None) -> Iterator[list[int]]:
        """Consecutive runs of `order`, each as long as the batch size is when it is asked for.

        With `lengths` (each row's token count; `order` ascending in it), a run also ends before the
        row that would pad it past `1 + PAD_SLACK` times its real tokens (`k * len_max > (1 + slack)
        * sum(len)`): a short sequence is not padded to a long one's width, while similar lengths
        still batch whole."""
        at = 0
        while at < len(order):
            rows = [int(i) for i in order[at : at + self.size]]
            if lengths is not None:
                rows = _unpadded_run(rows, lengths)
            at += len(rows)
            yield rows

    def attempt(self, rows: list[int], work: Callable[[list[int]], T]) -> list[tuple[list[int], T]]:
        """`[(rows, work(rows))]`; on out-of-memory, `work` on each half, recursively, down to one row.
        A row that fails alone is skipped (`finish` reports it). Each result comes with its rows."""
        try:
            return [(rows, work(rows))]
        except OOM_ERRORS:
            pass  # retried outside the handler: its traceback holds the failed forward's tensors
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(rows) == 1:
            self.skipped += rows
            return []
        half = (len(rows) + 1) // 2
        if half < self.size:
            self.size = half
            self._say(len(rows))
        return self.attempt(rows[:half], work) + self.attempt(rows[half:], work)

    def _say(self, failed: int) -> None:
        if self.said:
            return
        self.said = True
        warnings.warn(
            f"the accelerator ran out of memory on a batch of {failed} sequences; rewardlens halves the batch "
            f"and retries: batches of {self.size} from now on in this call (halved again on another "
            "out-of-memory, down to 1). Pass a smaller batch_size= to skip the failed tries",
            RewardLensWarning, stacklevel=2)

    def caller_ids(self, rows: Sequence[int]) -> list[int]:
        return [self.ids[r] if self.ids is not None else r for r in rows]

    def label(self, row: int) -> str:
        if self.labels is not None:
            return self.labels[row]
        return sequence_label(self.caller_ids([row])[0], self.is_pairs)

    def error(self, rows: Sequence[int] = ()) -> OutOfMemoryError:
        """The error naming the skipped rows (and `rows`, failed beyond the loop's repair)."""
        named: dict[int, str] = {}  # one entry per sequence (a loop's rows may be several runs of one)
        for row in sorted(set(self.skipped) | set(rows)):
            named.setdefault(self.caller_ids([row])[0], self.label(row))
        ids = sorted(named)
        pairs = sorted({pair_of(i)[0] for i in ids}) if self.is_pairs else None
        return OutOfMemoryError([named[i] for i in ids], ids, pairs)

    def finish(self) -> None:
        """Raise `OutOfMemoryError` naming every skipped row, if there is one."""
        if self.skipped:
            raise self.error()


def each_batch(order: Sequence[int], batch_size: int, work: Callable[[list[int]], object], *,
               ids: Sequence[int] | None = None, is_pairs: bool = False,
               lengths: Sequence[int] | None = None) -> None:
    """Call `work(rows)` on consecutive runs of `order`, `batch_size` rows at a time, backing off on
    out-of-memory (`Backoff`); then raise `OutOfMemoryError` if a row fitted in no batch. `work`
    writes its own results; a retried piece is run again whole, so writes must be idempotent."""
    loop = Backoff(batch_size, ids=ids, is_pairs=is_pairs)
    for rows in loop.chunks(order, lengths):
        with batch_work(len(rows)):
            loop.attempt(rows, work)
    loop.finish()


_ACTIVE: dict[int, tuple[Backoff, list[int]]] = {}
"""Batches `batch_loop` has yielded and not yet taken back: id(batch) → (its loop, its rows)."""


def batch_loop(
    order: Sequence[int] | np.ndarray, batch_size: int, ids: Sequence[int], is_pairs: bool,
    make: Callable[[list[int], list[str]], Batch], lengths: Sequence[int] | None = None,
) -> Iterator[tuple[np.ndarray, Batch]]:
    """`RewardModel.batches`: `make(rows, labels)` for consecutive runs of `order`, yielded with the
    rows; the size shrinks when `run_rows` backs off on one of them. Raises `OutOfMemoryError` at
    the end if some row fitted in no batch (its captured values were NaN)."""
    loop = Backoff(batch_size, ids=ids, is_pairs=is_pairs)
    for rows in loop.chunks(order, lengths):
        batch = make(rows, [loop.label(r) for r in rows])
        _ACTIVE[id(batch)] = (loop, rows)
        try:
            with batch_work(len(rows)):
                yield np.asarray(rows, dtype=np.int64), batch
        finally:
            _ACTIVE.pop(id(batch), None)
    loop.finish()


def select(batch: Batch, index: Sequence[int]) -> tuple[Batch, int]:
    """Rows `index` of `batch` without the columns that are padding in all of them (a short row must
    not stay padded to a long one's width: it would not fit where it fits alone), and the number of
    columns dropped on the left (left padding), by which every column index shifts."""
    at = torch.tensor(list(index), dtype=torch.long, device=batch.input_ids.device)
    real = torch.nonzero(batch.attention_mask[at.to(batch.attention_mask.device)].any(0))[:, 0]
    lo, hi = int(real.min()), int(real.max()) + 1

    def pick(t: Tensor) -> Tensor:
        return t[at.to(t.device), lo:hi]

    types = None if batch.token_type_ids is None else pick(batch.token_type_ids)
    return dataclasses.replace(
        batch, input_ids=pick(batch.input_ids), attention_mask=pick(batch.attention_mask),
        position_ids=pick(batch.position_ids), token_type_ids=types,
        read_at=batch.read_at[at.to(batch.read_at.device)] - lo,
        labels=None if batch.labels is None else [batch.labels[i] for i in index]), lo


def forward(model: Backbone, batch: Batch, points: Mapping[PointKey, Point]) -> dict[PointKey, Tensor]:
    """One no-grad forward of the backbone on `batch`, returning the captured points in fp32."""
    with torch.no_grad(), eval_mode(model.model), capture(points, model.device) as captured, layer_parts(model):
        model.backbone(**model.batch_kwargs(batch))
    return captured


@contextmanager
def layer_parts(model: Backbone) -> Iterator[None]:
    """While a metered batch runs (`metered`), each layer's end reports its share of the forward (`part`), so a
    progress bar moves within one long forward; nothing is hooked otherwise."""
    if not metered():
        yield
        return
    n = len(model.layers)

    def hook(i: int) -> Callable[..., None]:
        return lambda *_: part(i + 1, n)

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(model.layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_rows(model: Backbone, batch: Batch, points: Mapping[PointKey, Point]) -> dict[PointKey, Tensor]:
    """`forward`, split on out-of-memory into pieces of rows whose captured points are joined in
    row order. Rows that fit in no piece get NaN values and are reported by the loop that yielded
    the batch (`batch_loop`), or here, at once, for a batch built elsewhere."""
    n, active = batch.input_ids.shape[0], _ACTIVE.get(id(batch))
    loop, rows = active if active is not None else (
        Backoff(n, labels=batch.labels or [f"row {j}" for j in range(n)]), list(range(n)))
    where = {r: j for j, r in enumerate(rows)}

    def piece(sub: list[int]) -> dict[PointKey, Tensor]:
        if len(sub) == n:
            return forward(model, batch, points)
        index = [where[r] for r in sub]
        part, shift = select(batch, index)
        at = torch.tensor(index, dtype=torch.long)
        return forward(model, part, {k: _slice_point(p, at, shift, n)[0] for k, p in points.items()})

    pieces = loop.attempt(list(rows), piece)
    for _, got in pieces:
        loop.widths.update({k: v.shape[-1] for k, v in got.items()})
    if len(pieces) == 1 and len(pieces[0][0]) == n:
        return pieces[0][1]
    failed = sorted(set(rows) - {r for sub, _ in pieces for r in sub})
    if failed and (active is None or any(k not in loop.widths for k in points)):
        raise loop.error(failed)  # no loop to report them at its end, or no width to fill them with
    out = {k: torch.full((n if p.rows is None else len(p.rows), *p.cols.shape[1:], loop.widths[k]), float("nan"),
                         device=model.device) for k, p in points.items()}
    for sub, got in pieces:
        at = torch.tensor([where[r] for r in sub], dtype=torch.long)
        for k, v in got.items():
            out[k][_slice_point(points[k], at, 0, n)[1].to(model.device)] = v
    return out


def _slice_point(point: Point, at: Tensor, shift: int, n: int) -> tuple[Point, Tensor]:
    """`point` on the batch rows `at` (columns shifted left by `shift`), and which of its captured rows
    that keeps: `at` itself, or, for a point with read rows, the reads whose row is in `at`."""
    if point.rows is None:
        return dataclasses.replace(point, cols=point.cols[at.to(point.cols.device)] - shift), at
    rank = torch.full((n,), -1, dtype=torch.long)
    rank[at] = torch.arange(len(at))
    new = rank[point.rows.cpu()]
    keep = torch.nonzero(new >= 0)[:, 0]
    device = point.cols.device
    return dataclasses.replace(point, cols=point.cols[keep.to(device)] - shift,
                               rows=new[keep].to(device)), keep
