"""The model layer: load a reward model, map its architecture, and trace it (the user's face).

`load`/`wrap` and the reward-kind loaders (through `from_pretrained`, then the load-time proof
`verify`), `RewardModel` (the fp32 head, the read position, batches) and its declared `RewardKind`,
the read rule `Reads`, the declarative architecture maps (`ArchitectureMap`, `register_architecture`),
the `Part` and `TraceKey` values, the trace (one hooked forward → every part's write at the read
position), the `ReadCache` instruments share, the finiteness of results (`score_pairs`) and the score
parity certificate (`parity`). The plumbing the instruments build on (batches, hooks, tokenization, back-off, placement,
the expert split) is the sibling face `rewardlens.model.internal`. See docs/design.md §1–§3.
"""

from .._deprecated import moved as _moved
from ._arch import HEAD_KINDS as HEAD_KINDS
from ._arch import LAYOUTS as LAYOUTS
from ._arch import ArchitectureMap as ArchitectureMap
from ._arch import register_architecture as register_architecture
from ._core import UNSET as UNSET
from ._core import RewardModel as RewardModel
from ._core import Unset as Unset
from ._finite import SATURATED as SATURATED
from ._finite import FinitePairs as FinitePairs
from ._finite import PairAccuracy as PairAccuracy
from ._finite import dtype_name as dtype_name
from ._finite import finite_accuracy as finite_accuracy
from ._finite import finite_pairs as finite_pairs
from ._finite import pair_accuracy as pair_accuracy
from ._finite import score_pairs as score_pairs
from ._keys import TRACE_KINDS as TRACE_KINDS
from ._keys import TraceKey as TraceKey
from ._keys import TraceKind as TraceKind
from ._kind import KIND_NAMES as KIND_NAMES
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
from ._parity import CHECKS as PARITY_CHECKS
from ._parity import TOLERANCE as PARITY_TOLERANCE
from ._parity import Parity as Parity
from ._parity import ParityCheck as ParityCheck
from ._parity import parity as parity
from ._parts import KINDS as PART_KINDS
from ._parts import Part as Part
from ._parts import PartKind as PartKind
from ._parts import SublayerKind as SublayerKind
from ._read_cache import ReadCache as ReadCache
from ._reads import COMBINES as COMBINES
from ._reads import READ_AT as READ_AT
from ._reads import Combine as Combine
from ._reads import ReadAt as ReadAt
from ._reads import Reads as Reads
from ._trace import Trace as Trace
from ._trace import trace as trace
from ._verify import verify as verify

# Renamed in 0.2 (docs/design.md "Words"); the old names work for one release.
__getattr__ = _moved(__name__, {"KINDS": "rewardlens.model:PART_KINDS"})

__all__ = [
    "ArchitectureMap",
    "COMBINES",
    "Combine",
    "FinitePairs",
    "HEAD_KINDS",
    "PART_KINDS",
    "KIND_NAMES",
    "KindName",
    "LAYOUTS",
    "Part",
    "PARITY_CHECKS",
    "PARITY_TOLERANCE",
    "PairAccuracy",
    "Parity",
    "ParityCheck",
    "PartKind",
    "READ_AT",
    "ReadAt",
    "ReadCache",
    "Reads",
    "ReferenceTerm",
    "RewardKind",
    "RewardModel",
    "SATURATED",
    "SublayerKind",
    "TRACE_KINDS",
    "Trace",
    "TraceKey",
    "TraceKind",
    "UNSET",
    "Unset",
    "dtype_name",
    "finite_accuracy",
    "finite_pairs",
    "load",
    "load_dpo",
    "load_judge",
    "load_prm",
    "pair_accuracy",
    "parity",
    "register_architecture",
    "score_pairs",
    "trace",
    "verify",
    "wrap",
    "wrap_dpo",
    "wrap_judge",
    "wrap_prm",
]
