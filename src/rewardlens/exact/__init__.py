"""Exact instruments: the decomposition of a reward into every part's contribution, attribution, and the lens.

`decompose` walks the read-out vectors back through the frozen norms (docs/design.md §1); `attribute` and
`lens` are views of one decomposition. Parts plus the constant equal the model's reward to float precision.
`tokens` splits every head's part further over the source tokens its attention row at `t*` reads (docs/tokens.md).
The plumbing other layers build on (read-out vectors, a trace's decomposition, part names) is `exact.internal`.
"""

from .._deprecated import moved as _moved
from ._attribution import Attribution as Attribution
from ._attribution import attribute as attribute
from ._decompose import LEVELS as LEVELS
from ._decompose import Decomposition as Decomposition
from ._decompose import decompose as decompose
from ._lens import Lens as Lens
from ._lens import lens as lens
from ._steps import Steps as Steps
from ._tokens import TokenAttribution as TokenAttribution
from ._tokens import tokens as tokens

# The plumbing moved to `rewardlens.exact.internal` (0.2); the old names work for one release.
__getattr__ = _moved(__name__, dict.fromkeys(
    ("STEP_FIELDS", "decompose_trace", "has_bias_part", "part_names", "readout_vectors"), "rewardlens.exact.internal"))

__all__ = [
    "Attribution",
    "Decomposition",
    "LEVELS",
    "Lens",
    "Steps",
    "TokenAttribution",
    "attribute",
    "decompose",
    "lens",
    "tokens",
]
