"""Exact instruments: the decomposition of a reward into every part's contribution, attribution, and the lens.

`decompose` walks the read-out vectors back through the frozen norms (docs/design.md §1); `attribute` and
`lens` are views of one decomposition. Parts plus the constant equal the model's reward to float precision.
`tokens` splits every head's part further over the source tokens its attention row at `t*` reads (docs/tokens.md).
"""

from ._attribution import Attribution as Attribution
from ._attribution import attribute as attribute
from ._decompose import LEVELS as LEVELS
from ._decompose import Decomposition as Decomposition
from ._decompose import decompose as decompose
from ._decompose import decompose_trace as decompose_trace
from ._decompose import has_bias_part as has_bias_part
from ._decompose import part_names as part_names
from ._decompose import readout_vectors as readout_vectors
from ._lens import Lens as Lens
from ._lens import lens as lens
from ._steps import STEP_FIELDS as STEP_FIELDS
from ._steps import Steps as Steps
from ._tokens import TokenAttribution as TokenAttribution
from ._tokens import tokens as tokens

__all__ = [
    "Attribution",
    "Decomposition",
    "LEVELS",
    "Lens",
    "STEP_FIELDS",
    "Steps",
    "TokenAttribution",
    "attribute",
    "decompose",
    "decompose_trace",
    "has_bias_part",
    "lens",
    "part_names",
    "readout_vectors",
    "tokens",
]
