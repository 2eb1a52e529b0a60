"""The exact layer's plumbing for its sibling subpackages: the decomposition of an existing trace, the read-out
vectors walked back through the frozen norms, the part names a decomposition yields, the per-read row fields.
Users call `attribute`, `lens`, `tokens` and `decompose` (`rewardlens.exact`); the instruments and workflows
import these names from here, as `rewardlens.model.internal` keeps the model layer's plumbing apart.
"""

from ._decompose import decompose_trace as decompose_trace
from ._decompose import has_bias_part as has_bias_part
from ._decompose import part_names as part_names
from ._decompose import readout_vectors as readout_vectors
from ._steps import STEP_FIELDS as STEP_FIELDS

__all__ = ["STEP_FIELDS", "decompose_trace", "has_bias_part", "part_names", "readout_vectors"]
