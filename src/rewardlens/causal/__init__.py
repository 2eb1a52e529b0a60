"""Causal instruments: activation patching and its engines, divergence, attribution patching, faithfulness.

`patch` runs noising, denoising or ablation at the read position, everywhere, or on spans, for the total
or the path-frozen direct estimand (docs/design.md §5); `faithfulness` sets attribution beside them.
"""

from ._attribution_patching import agreement as agreement
from ._attribution_patching import attribution_patch as attribution_patch
from ._circuit import Circuit as Circuit
from ._circuit import circuit as circuit
from ._divergence import NaturalFit as NaturalFit
from ._divergence import natural_states as natural_states
from ._edges import Edges as Edges
from ._edges import edges as edges
from ._faithfulness import ESTIMANDS as ESTIMANDS
from ._faithfulness import Faithfulness as Faithfulness
from ._faithfulness import aligned as aligned
from ._faithfulness import faithfulness as faithfulness
from ._patching import MODES as MODES
from ._patching import Patching as Patching
from ._patching import patch as patch
from ._path import PathPatching as PathPatching
from ._path import path_patch as path_patch
from ._plan import encode_pairs as encode_pairs
from ._reads_patch import patch_mode as patch_mode
from ._spec import PatchSpec as PatchSpec
from ._traced import Traced as Traced
from ._traced import trace_pairs as trace_pairs

__all__ = [
    "Circuit",
    "ESTIMANDS",
    "Edges",
    "circuit",
    "edges",
    "Faithfulness",
    "MODES",
    "NaturalFit",
    "PatchSpec",
    "PathPatching",
    "Patching",
    "agreement",
    "aligned",
    "encode_pairs",
    "attribution_patch",
    "faithfulness",
    "natural_states",
    "patch",
    "path_patch",
    "patch_mode",
    "trace_pairs",
    "Traced",
]
