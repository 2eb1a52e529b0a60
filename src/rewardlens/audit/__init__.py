"""The audit: every instrument over a pair set into a resumable SQLite store, and its HTML report.

`audit(model, pairs, store=...)` runs it and returns the `Audit` (read back from the `Store`); a `Plan`
says what to run, `resume_status` what a rerun would reuse. The plumbing (content keys, checksums, the
run lock, the chunk runner, shard paths) is `rewardlens.audit.internal`.
"""

from .._deprecated import moved as _moved
from ._natural import NaturalStates as NaturalStates
from ._plan import Decided as Decided
from ._plan import Plan as Plan
from ._runner import Audit as Audit
from ._store import Store as Store
from ._workflow import ResumeStatus as ResumeStatus
from ._workflow import audit as audit
from ._workflow import resume_status as resume_status

# The plumbing moved to `rewardlens.audit.internal` (0.2); the old names work for one release.
__getattr__ = _moved(__name__, dict.fromkeys(
    ("Holder", "RunKey", "RunLock", "STORED_RESULTS", "TOKEN_PAIRS", "VERSION", "checksum", "collect", "content_key",
     "fingerprint", "plan_for_model", "run_lock", "run_pairs", "run_whole", "schema_version", "shard_path",
     "shown_pairs"), "rewardlens.audit.internal"))

__all__ = [
    "Audit",
    "Decided",
    "NaturalStates",
    "Plan",
    "ResumeStatus",
    "Store",
    "audit",
    "resume_status",
]
