"""The one progress bar every long step shows: a tqdm bar on stderr with elapsed time, off by default.

tqdm is imported when a bar is made, not when this module is, so the command line's early imports
stay light.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm.auto import tqdm


def progress_bar(total: int | None, desc: str, enabled: bool, *, unit: str = "it") -> tqdm[Any]:
    """A tqdm bar of `total` steps on stderr, gone when closed; disabled (prints nothing) unless
    `enabled` and there is something to count. Use it as a context manager or call `close()`."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled or total == 0, file=sys.stderr,
                leave=False, dynamic_ncols=True)


_ACTIVE: ContextVar[tqdm[Any] | None] = ContextVar("rewardlens_progress", default=None)


@contextmanager
def counting(desc: str, enabled: bool, *, unit: str = "batch") -> Iterator[tqdm[Any]]:
    """A bar that every batch loop inside the block advances (`tick`): for instruments whose work is
    several loops of unknown length (a patch sweep: clean runs, then the engine's batches), it shows
    batches done, their rate and the time. A block inside another's keeps the outer bar."""
    outer = _ACTIVE.get()
    if outer is not None:
        yield outer
        return
    bar = progress_bar(None, desc, enabled, unit=unit)
    token = _ACTIVE.set(bar)
    try:
        yield bar
    finally:
        _ACTIVE.reset(token)
        bar.close()


def tick(n: int = 1) -> None:
    """Advance the bar of the enclosing `counting` block, if any (a no-op otherwise)."""
    bar = _ACTIVE.get()
    if bar is not None:
        bar.update(n)


def stage(name: str) -> None:
    """Name the step the enclosing `counting` block is in (shown after its count)."""
    bar = _ACTIVE.get()
    if bar is not None:
        bar.set_postfix_str(name)


_WORK: ContextVar[Callable[[float], object] | None] = ContextVar("rewardlens_work", default=None)
_BATCH: ContextVar[list[float] | None] = ContextVar("rewardlens_batch", default=None)
"""The batch in flight: [its rows, the rows `part` has reported of it so far]."""


@contextmanager
def metering(step: Callable[[float], object]) -> Iterator[None]:
    """Every batch loop inside the block reports the rows (sequences) it has run to `step(rows)`: a batch's
    rows as it ends, in parts while a long batch runs (`part`). A caller whose unit is not the loops'
    (the audit's pairs) counts its progress from them."""
    token = _WORK.set(step)
    try:
        yield
    finally:
        _WORK.reset(token)


@contextmanager
def batch_work(rows: int) -> Iterator[None]:
    """One batch of `rows` sequences of a batch loop: when it ends it ticks the enclosing `counting` bar (`tick`)
    and reports its rows to the enclosing `metering` block (less what `part` reported while it ran). A batch
    run inside another's is part of that one: its rows are not reported again."""
    step = _WORK.get()
    if step is None or _BATCH.get() is not None:
        yield
        tick()
        return
    held = [float(rows), 0.0]
    token = _BATCH.set(held)
    try:
        yield
    finally:
        _BATCH.reset(token)
    step(held[0] - held[1])
    tick()


def metered() -> bool:
    """Whether a batch of a `metering` block is in flight (so that reporting its parts is heard)."""
    return _WORK.get() is not None and _BATCH.get() is not None


def part(done: int, total: int) -> None:
    """Inside a long batch: `done` of its `total` steps (an engine's layers, its groups of sites) are finished;
    the enclosing `metering` block hears that share of the batch's rows. A no-op outside one."""
    step, held = _WORK.get(), _BATCH.get()
    if step is None or held is None or total <= 0:
        return
    reach = held[0] * min(done, total) / total
    if reach > held[1]:
        step(reach - held[1])
        held[1] = reach


class UnitMeter:
    """Moves a bar counted in the caller's units (an audit's pairs) while a block of `k` units runs whose units
    all finish at its end: the batch loops inside report the sequences they run (`metering`), and every unit
    costs the same sequences (a pair: one trace of both sides, then each estimand's runs of its target), so
    the block's share of its units is the share of its sequences run. What a unit costs is learnt from the
    first block (keep it small: the audit's first span is one pair); until then the bar counts sequences
    beside the units. A unit shows as done only when its block is."""

    def __init__(self, bar: tqdm[Any]) -> None:
        self.bar = bar
        self.per_unit: float | None = None

    @contextmanager
    def chunk(self, k: int) -> Iterator[None]:
        """Meter one block of `k` units; the bar stands at its end once the block is done."""
        start, work = self.bar.n, [0.0]

        def step(rows: float) -> None:
            work[0] += rows
            if self.per_unit is None:
                self.bar.set_postfix_str(f"{work[0]:.0f} sequences run")
                return
            shown = start + min(k - 1, int(work[0] / self.per_unit))
            if shown > self.bar.n:
                self.bar.update(shown - self.bar.n)

        with metering(step):
            yield
        self.bar.update(start + k - self.bar.n)
        if work[0] > 0:
            self.per_unit = work[0] / k
