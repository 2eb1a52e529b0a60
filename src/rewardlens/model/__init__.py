"""The model layer: load a reward model, map its architecture, tokenize and batch, and trace it.

Everything an instrument needs of a reward model lives here: `load`/`wrap` (through `from_pretrained`,
then the load-time proof `verify`), `RewardModel` (the fp32 head, the read position, batches), the
declarative architecture maps, the hooks that capture and rewrite module outputs, and the trace
(one hooked forward → every part's write at the read position, keyed by `TraceKey`). See
docs/design.md §1–§3.
"""

from ._arch import HEAD_KINDS as HEAD_KINDS
from ._arch import LAYOUTS as LAYOUTS
from ._arch import ArchitectureMap as ArchitectureMap
from ._arch import discover as discover
from ._arch import find_map as find_map
from ._arch import get_module as get_module
from ._arch import hf_config as hf_config
from ._arch import register_architecture as register_architecture
from ._core import UNSET as UNSET
from ._core import RewardModel as RewardModel
from ._core import Unset as Unset
from ._hooks import Point as Point
from ._hooks import capture as capture
from ._hooks import eval_mode as eval_mode
from ._hooks import first_output as first_output
from ._hooks import hidden_arg as hidden_arg
from ._hooks import rewriting as rewriting
from ._keys import TRACE_KINDS as TRACE_KINDS
from ._keys import TraceKey as TraceKey
from ._keys import TraceKind as TraceKind
from ._kind import KIND_NAMES as KIND_NAMES
from ._kind import KindName as KindName
from ._kind import ReferenceTerm as ReferenceTerm
from ._kind import RewardKind as RewardKind
from ._kinds import load_dpo as load_dpo
from ._kinds import load_judge as load_judge
from ._kinds import load_prm as load_prm
from ._kinds import read_values as read_values
from ._kinds import wrap_dpo as wrap_dpo
from ._kinds import wrap_judge as wrap_judge
from ._kinds import wrap_prm as wrap_prm
from ._load import load as load
from ._load import wrap as wrap
from ._moe import check_moe_map as check_moe_map
from ._moe import expert_parts as expert_parts
from ._moe import expert_writes as expert_writes
from ._moe import is_moe_layer as is_moe_layer
from ._oom import OOM_ERRORS as OOM_ERRORS
from ._oom import PAD_SLACK as PAD_SLACK
from ._oom import Backoff as Backoff
from ._oom import each_batch as each_batch
from ._parts import KINDS as KINDS
from ._parts import Part as Part
from ._parts import PartKind as PartKind
from ._parts import SublayerKind as SublayerKind
from ._placement import execution_device as execution_device
from ._placement import onloaded as onloaded
from ._reads import COMBINES as COMBINES
from ._reads import READ_AT as READ_AT
from ._reads import Combine as Combine
from ._reads import ReadAt as ReadAt
from ._reads import Reads as Reads
from ._reads import ReadSet as ReadSet
from ._reads import one_read_only as one_read_only
from ._tokens import Batch as Batch
from ._tokens import Tokenized as Tokenized
from ._tokens import TokenMemo as TokenMemo
from ._tokens import collate as collate
from ._tokens import fit_length as fit_length
from ._tokens import flatten_inputs as flatten_inputs
from ._tokens import sequence_label as sequence_label
from ._tokens import tokenize as tokenize
from ._trace import Trace as Trace
from ._trace import bookkeeping_error as bookkeeping_error
from ._trace import out_projection as out_projection
from ._trace import points as points
from ._trace import projection_inputs as projection_inputs
from ._trace import sublayer_part as sublayer_part
from ._trace import trace as trace
from ._verify import check_bookkeeping as check_bookkeeping
from ._verify import check_structure as check_structure
from ._verify import verify as verify

__all__ = [
    "COMBINES",
    "Combine",
    "READ_AT",
    "ReadAt",
    "ReadSet",
    "Reads",
    "ReferenceTerm",
    "KIND_NAMES",
    "KindName",
    "RewardKind",
    "load_dpo",
    "load_judge",
    "load_prm",
    "read_values",
    "wrap_dpo",
    "wrap_judge",
    "wrap_prm",
    "one_read_only",
    "KINDS",
    "Part",
    "PartKind",
    "SublayerKind",
    "ArchitectureMap",
    "Batch",
    "HEAD_KINDS",
    "OOM_ERRORS",
    "PAD_SLACK",
    "Backoff",
    "LAYOUTS",
    "Point",
    "RewardModel",
    "TokenMemo",
    "Tokenized",
    "Trace",
    "TRACE_KINDS",
    "TraceKey",
    "TraceKind",
    "UNSET",
    "Unset",
    "bookkeeping_error",
    "capture",
    "check_bookkeeping",
    "check_moe_map",
    "check_structure",
    "collate",
    "discover",
    "each_batch",
    "eval_mode",
    "execution_device",
    "expert_parts",
    "expert_writes",
    "find_map",
    "first_output",
    "fit_length",
    "flatten_inputs",
    "get_module",
    "hf_config",
    "hidden_arg",
    "is_moe_layer",
    "load",
    "onloaded",
    "out_projection",
    "points",
    "projection_inputs",
    "register_architecture",
    "rewriting",
    "sequence_label",
    "sublayer_part",
    "tokenize",
    "trace",
    "verify",
    "wrap",
]
