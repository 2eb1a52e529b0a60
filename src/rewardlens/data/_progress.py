"""The one progress bar every long step shows: a tqdm bar on stderr with elapsed time, off by default.

tqdm is imported when a bar is made, not when this module is, so the command line's early imports
stay light.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
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
