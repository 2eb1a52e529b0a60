"""The model layer's face for its sibling subpackages: the plumbing every instrument builds on (batches,
capture points and hooks, tokenization, the read loop's back-off, placement of offloaded weights, the
mixture-of-experts split, the load-time checks, the finiteness of results, the tuples of allowed values and
the `UNSET` default). Users import `rewardlens.model`; the instruments and
workflows import these names from here (`from ..model.internal import ...`), as equinox keeps
`equinox.internal` apart from its user face.
"""

from ._arch import HEAD_KINDS as HEAD_KINDS
from ._arch import LAYOUTS as LAYOUTS
from ._arch import discover as discover
from ._arch import find_map as find_map
from ._arch import get_module as get_module
from ._arch import hf_config as hf_config
from ._continuing import additive_mask as additive_mask
from ._continuing import agrees as agrees
from ._continuing import cache_name as cache_name
from ._continuing import cache_of as cache_of
from ._continuing import cache_rows as cache_rows
from ._continuing import cached_forward as cached_forward
from ._continuing import continuable as continuable
from ._continuing import continuation_args as continuation_args
from ._continuing import continuation_mask as continuation_mask
from ._continuing import fork_cache as fork_cache
from ._continuing import not_continuable as not_continuable
from ._continuing import packed as packed
from ._continuing import proof_tol as proof_tol
from ._continuing import reproduces as reproduces
from ._core import UNSET as UNSET
from ._core import Unset as Unset
from ._finite import SATURATED as SATURATED
from ._finite import FinitePairs as FinitePairs
from ._finite import PairAccuracy as PairAccuracy
from ._finite import dtype_name as dtype_name
from ._finite import finite_accuracy as finite_accuracy
from ._finite import finite_pairs as finite_pairs
from ._finite import pair_accuracy as pair_accuracy
from ._finite import score_pairs as score_pairs
from ._hooks import Point as Point
from ._hooks import capture as capture
from ._hooks import eval_mode as eval_mode
from ._hooks import first_output as first_output
from ._hooks import hidden_arg as hidden_arg
from ._hooks import rewriting as rewriting
from ._keys import TRACE_KINDS as TRACE_KINDS
from ._kind import KIND_NAMES as KIND_NAMES
from ._kind_loaders import read_values as read_values
from ._moe import check_moe_map as check_moe_map
from ._moe import expert_parts as expert_parts
from ._moe import expert_writes as expert_writes
from ._moe import is_moe_layer as is_moe_layer
from ._oom import OOM_ERRORS as OOM_ERRORS
from ._oom import PAD_SLACK as PAD_SLACK
from ._oom import Backoff as Backoff
from ._oom import each_batch as each_batch
from ._parity import CHECKS as PARITY_CHECKS
from ._parity import TOLERANCE as PARITY_TOLERANCE
from ._parts import KINDS as PART_KINDS
from ._placement import execution_device as execution_device
from ._placement import onloaded as onloaded
from ._reads import COMBINES as COMBINES
from ._reads import READ_AT as READ_AT
from ._reads import ReadSet as ReadSet
from ._reads import one_read_only as one_read_only
from ._roles import ROLES as ROLES
from ._roles import roles_of as roles_of
from ._stepping import LayerTaps as LayerTaps
from ._stepping import Recording as Recording
from ._stepping import stepped_readout as stepped_readout
from ._stepping import stepping_works as stepping_works
from ._stepping import unambiguous as unambiguous
from ._tokens import Batch as Batch
from ._tokens import Tokenized as Tokenized
from ._tokens import TokenMemo as TokenMemo
from ._tokens import collate as collate
from ._tokens import fit_length as fit_length
from ._tokens import flatten_inputs as flatten_inputs
from ._tokens import sequence_label as sequence_label
from ._tokens import tokenize as tokenize
from ._trace import bookkeeping_error as bookkeeping_error
from ._trace import out_projection as out_projection
from ._trace import points as points
from ._trace import projection_inputs as projection_inputs
from ._trace import sublayer_part as sublayer_part
from ._verify import check_bookkeeping as check_bookkeeping
from ._verify import check_structure as check_structure

__all__ = [
    "Backoff",
    "Batch",
    "COMBINES",
    "FinitePairs",
    "HEAD_KINDS",
    "KIND_NAMES",
    "LAYOUTS",
    "LayerTaps",
    "OOM_ERRORS",
    "PAD_SLACK",
    "PARITY_CHECKS",
    "PARITY_TOLERANCE",
    "PART_KINDS",
    "PairAccuracy",
    "Point",
    "READ_AT",
    "ROLES",
    "ReadSet",
    "Recording",
    "SATURATED",
    "TRACE_KINDS",
    "TokenMemo",
    "Tokenized",
    "UNSET",
    "Unset",
    "additive_mask",
    "agrees",
    "bookkeeping_error",
    "cache_name",
    "cache_of",
    "cache_rows",
    "cached_forward",
    "capture",
    "check_bookkeeping",
    "check_moe_map",
    "check_structure",
    "collate",
    "continuable",
    "continuation_args",
    "continuation_mask",
    "discover",
    "dtype_name",
    "each_batch",
    "eval_mode",
    "execution_device",
    "expert_parts",
    "expert_writes",
    "find_map",
    "finite_accuracy",
    "finite_pairs",
    "first_output",
    "fit_length",
    "flatten_inputs",
    "fork_cache",
    "get_module",
    "hf_config",
    "hidden_arg",
    "is_moe_layer",
    "not_continuable",
    "one_read_only",
    "onloaded",
    "out_projection",
    "packed",
    "pair_accuracy",
    "points",
    "projection_inputs",
    "proof_tol",
    "read_values",
    "reproduces",
    "rewriting",
    "roles_of",
    "score_pairs",
    "sequence_label",
    "stepped_readout",
    "stepping_works",
    "sublayer_part",
    "tokenize",
    "unambiguous",
]
