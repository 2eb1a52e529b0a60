"""The model layer: load a reward model, map its architecture, and trace it (the user's face).

`load`/`wrap` and the reward-kind loaders (through `from_pretrained`, then the load-time proof
`verify`), `RewardModel` (the fp32 head, the read position, batches) and its declared `RewardKind`,
the read rule `Reads`, the declarative architecture maps (`ArchitectureMap`, `register_architecture`),
the `Part` and `TraceKey` values, the trace (one hooked forward → every part's write at the read
position), the `ReadCache` instruments share and the score parity certificate (`parity`); the `Literal`
types a user annotates with (`ReadAt`, `PartKind`, `TraceKind` ...). The plumbing the instruments build on
(batches, hooks, tokenization, back-off, placement, the expert split, the finiteness of results
`score_pairs`, the tuples of allowed values such as `COMBINES`) is the sibling face
`rewardlens.model.internal`. See docs/design.md §1–§3.
"""

from .._deprecated import moved as _moved
from ._arch import ArchitectureMap as ArchitectureMap
from ._arch import register_architecture as register_architecture
from ._core import RewardModel as RewardModel
from ._keys import TraceKey as TraceKey
from ._keys import TraceKind as TraceKind
from ._kind import KindName as KindName
from ._kind import ReferenceTerm as ReferenceTerm
from ._kind import RewardKind as RewardKind
from ._kind_loaders import load_dpo as load_dpo
from ._kind_loaders import load_judge as load_judge
from ._kind_loaders import load_prm as load_prm
from ._kind_loaders import wrap_dpo as wrap_dpo
from ._kind_loaders import wrap_judge as wrap_judge
from ._kind_loaders import wrap_prm as wrap_prm
from ._load import load as load
from ._load import wrap as wrap
from ._parity import Parity as Parity
from ._parity import ParityCheck as ParityCheck
from ._parity import parity as parity
from ._parts import Part as Part
from ._parts import PartKind as PartKind
from ._parts import SublayerKind as SublayerKind
from ._read_cache import ReadCache as ReadCache
from ._reads import Combine as Combine
from ._reads import ReadAt as ReadAt
from ._reads import Reads as Reads
from ._trace import Trace as Trace
from ._trace import trace as trace
from ._verify import verify as verify

# Renamed in 0.2 (docs/design.md "Words"), or moved to `rewardlens.model.internal` (plumbing, issue 43 item 3);
# the old names work for one release.
__getattr__ = _moved(__name__, {
    "KINDS": "rewardlens.model.internal:PART_KINDS",
    **dict.fromkeys(("COMBINES", "FinitePairs", "HEAD_KINDS", "KIND_NAMES", "LAYOUTS", "PARITY_CHECKS",
                     "PARITY_TOLERANCE", "PART_KINDS", "PairAccuracy", "READ_AT", "SATURATED", "TRACE_KINDS",
                     "UNSET", "Unset", "dtype_name", "finite_accuracy", "finite_pairs", "pair_accuracy",
                     "score_pairs"), "rewardlens.model.internal")})

__all__ = [
    "ArchitectureMap",
    "Combine",
    "KindName",
    "Part",
    "Parity",
    "ParityCheck",
    "PartKind",
    "ReadAt",
    "ReadCache",
    "Reads",
    "ReferenceTerm",
    "RewardKind",
    "RewardModel",
    "SublayerKind",
    "Trace",
    "TraceKey",
    "TraceKind",
    "load",
    "load_dpo",
    "load_judge",
    "load_prm",
    "parity",
    "register_architecture",
    "trace",
    "verify",
    "wrap",
    "wrap_dpo",
    "wrap_judge",
    "wrap_prm",
]
