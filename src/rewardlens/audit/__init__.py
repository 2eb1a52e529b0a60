"""The audit: every instrument over a pair set into a resumable SQLite store, and its HTML report.

`run_lock(out)` keeps a second run out of a folder a run is writing (the store and the report).
"""

from ._keys import RunKey as RunKey
from ._keys import checksum as checksum
from ._keys import content_key as content_key
from ._keys import fingerprint as fingerprint
from ._keys import schema_version as schema_version
from ._lock import Holder as Holder
from ._lock import RunLock as RunLock
from ._lock import run_lock as run_lock
from ._natural import NaturalStates as NaturalStates
from ._plan import STORED_RESULTS as STORED_RESULTS
from ._plan import VERSION as VERSION
from ._plan import Decided as Decided
from ._plan import Plan as Plan
from ._runner import Audit as Audit
from ._runner import collect as collect
from ._runner import plan_for_model as plan_for_model
from ._runner import run_pairs as run_pairs
from ._store import Store as Store
from ._whole import TOKEN_PAIRS as TOKEN_PAIRS
from ._whole import run_whole as run_whole
from ._whole import shown_pairs as shown_pairs
from ._workflow import ResumeStatus as ResumeStatus
from ._workflow import audit as audit
from ._workflow import resume_status as resume_status
from ._workflow import shard_path as shard_path

__all__ = [
    "Audit",
    "Decided",
    "Holder",
    "NaturalStates",
    "Plan",
    "RunLock",
    "ResumeStatus",
    "RunKey",
    "STORED_RESULTS",
    "TOKEN_PAIRS",
    "Store",
    "VERSION",
    "audit",
    "checksum",
    "collect",
    "content_key",
    "fingerprint",
    "run_lock",
    "plan_for_model",
    "run_pairs",
    "schema_version",
    "resume_status",
    "run_whole",
    "shard_path",
    "shown_pairs",
]
