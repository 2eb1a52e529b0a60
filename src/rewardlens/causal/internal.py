"""The causal layer's face for its sibling subpackages: the plumbing the audit and the calibration build on
(the pairs' token ids, whether every pair's sides align, the natural-state fit divergence scores against,
faithfulness with its total's divergence-scored sweep, the tuples of allowed modes and estimands). Users import
`rewardlens.causal` (`patch`, `faithfulness`, ...); workflows import these names from here
(`from ..causal.internal import ...`), as `rewardlens.model.internal`.
"""

from ._divergence import NaturalFit as NaturalFit
from ._divergence import natural_states as natural_states
from ._faithfulness import ESTIMANDS as ESTIMANDS
from ._faithfulness import aligned as aligned
from ._faithfulness import scored_faithfulness as scored_faithfulness
from ._patching import MODES as MODES
from ._plan import encode_pairs as encode_pairs

__all__ = [
    "ESTIMANDS",
    "MODES",
    "NaturalFit",
    "aligned",
    "encode_pairs",
    "natural_states",
    "scored_faithfulness",
]
