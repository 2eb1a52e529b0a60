"""The base layer's face for its sibling subpackages: the progress plumbing every long step shares (one
tqdm bar on stderr, the batch counter, the unit meter), and the row layout's index plumbing (`interleave`,
`is_chosen`, `rows_of`, `pair_rows`, `pair_span`: data/_rows.py, so no caller writes `2 * i + 1`).
Users pass `progress=True`; the instruments and
workflows import these names from here (`from ..data.internal import ...`), as `rewardlens.model.internal`
keeps the model layer's plumbing apart from its user face.
"""

from ._progress import UnitMeter as UnitMeter
from ._progress import batch_work as batch_work
from ._progress import counting as counting
from ._progress import metered as metered
from ._progress import metering as metering
from ._progress import part as part
from ._progress import progress_bar as progress_bar
from ._progress import stage as stage
from ._progress import tick as tick
from ._rows import interleave as interleave
from ._rows import is_chosen as is_chosen
from ._rows import pair_rows as pair_rows
from ._rows import pair_span as pair_span
from ._rows import rows_of as rows_of

__all__ = ["UnitMeter", "batch_work", "counting", "interleave", "is_chosen", "metered", "metering", "pair_rows",
           "pair_span", "part", "progress_bar", "rows_of", "stage", "tick"]
