"""The one progress bar every long step shows: a tqdm bar on stderr with elapsed time, off by default.

tqdm is imported when a bar is made, not when this module is, so the command line's early imports
stay light.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm.auto import tqdm


def progress_bar(total: int | None, desc: str, enabled: bool, *, unit: str = "it") -> tqdm[Any]:
    """A tqdm bar of `total` steps on stderr, gone when closed; disabled (prints nothing) unless
    `enabled` and there is something to count. Use it as a context manager or call `close()`."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled or total == 0, file=sys.stderr,
                leave=False, dynamic_ncols=True)
