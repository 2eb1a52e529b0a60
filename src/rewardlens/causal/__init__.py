"""Causal instruments: activation patching and its engines, divergence, attribution patching, faithfulness.

`patch` runs noising, denoising or ablation at the read position, everywhere, or on spans, for the total
or the path-frozen direct estimand (docs/design.md §5); `faithfulness` sets attribution beside them. The
plumbing the audit builds on (the pairs' token ids, side alignment, the natural-state fit) is
`rewardlens.causal.internal`.
"""

from .._deprecated import moved as _moved
from ._attribution_patching import agreement as agreement
from ._attribution_patching import attribution_patch as attribution_patch
from ._circuit import Circuit as Circuit
from ._circuit import circuit as circuit
from ._edges import Edges as Edges
from ._edges import edges as edges
from ._faithfulness import Faithfulness as Faithfulness
from ._faithfulness import faithfulness as faithfulness
from ._patching import Patching as Patching
from ._patching import patch as patch
from ._path import PathPatching as PathPatching
from ._path import path_patch as path_patch
from ._reads_patch import patch_mode as patch_mode
from ._spec import PatchSpec as PatchSpec
from ._traced import Traced as Traced
from ._traced import trace_pairs as trace_pairs

# Plumbing moved to `rewardlens.causal.internal` (0.2, issue 43 item 3); the old names work for one release.
__getattr__ = _moved(__name__, dict.fromkeys(
    ("ESTIMANDS", "MODES", "NaturalFit", "aligned", "encode_pairs", "natural_states"), "rewardlens.causal.internal"))

__all__ = [
    "Circuit",
    "Edges",
    "circuit",
    "edges",
    "Faithfulness",
    "PatchSpec",
    "PathPatching",
    "Patching",
    "agreement",
    "attribution_patch",
    "faithfulness",
    "patch",
    "path_patch",
    "patch_mode",
    "trace_pairs",
    "Traced",
]
