"""The audit's plumbing, for the command line, the tests and tools that drive a run by hand: the content
keys and checksums that bind a store to its pairs, the run lock, the chunk runner and the whole-model
steps, shard paths. Users call `rewardlens.audit.audit` and read the `Audit` it returns; see
docs/audit.md for what each of these guarantees.
"""

from ._graph import check_graph as check_graph
from ._keys import RunKey as RunKey
from ._keys import checksum as checksum
from ._keys import content_key as content_key
from ._keys import fingerprint as fingerprint
from ._keys import schema_version as schema_version
from ._lock import Holder as Holder
from ._lock import RunLock as RunLock
from ._lock import run_lock as run_lock
from ._plan import STORED_RESULTS as STORED_RESULTS
from ._plan import VERSION as VERSION
from ._runner import collect as collect
from ._runner import plan_for_model as plan_for_model
from ._runner import run_pairs as run_pairs
from ._whole import TOKEN_PAIRS as TOKEN_PAIRS
from ._whole import run_whole as run_whole
from ._whole import shown_pairs as shown_pairs
from ._workflow import shard_path as shard_path

__all__ = [
    "Holder",
    "RunKey",
    "RunLock",
    "STORED_RESULTS",
    "TOKEN_PAIRS",
    "VERSION",
    "check_graph",
    "checksum",
    "collect",
    "content_key",
    "fingerprint",
    "plan_for_model",
    "run_lock",
    "run_pairs",
    "run_whole",
    "schema_version",
    "shard_path",
    "shown_pairs",
]
