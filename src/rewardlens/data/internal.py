"""The base layer's face for its sibling subpackages: the progress plumbing every long step shares (one
tqdm bar on stderr, the batch counter, the unit meter). Users pass `progress=True`; the instruments and
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

__all__ = ["UnitMeter", "batch_work", "counting", "metered", "metering", "part", "progress_bar", "stage", "tick"]
