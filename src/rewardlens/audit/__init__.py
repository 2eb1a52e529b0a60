"""The audit: every instrument over a pair set into a resumable SQLite store, and its HTML report.

`run_lock(out)` keeps a second run out of a folder a run is writing (the store and the report).
"""

from ._lock import Holder as Holder
from ._lock import RunLock as RunLock
from ._lock import run_lock as run_lock
from ._runner import VERSION as VERSION
from ._runner import Audit as Audit
from ._runner import Plan as Plan
from ._runner import audit as audit
from ._runner import collect as collect
from ._runner import run_pairs as run_pairs
from ._runner import run_whole as run_whole
from ._store import RunKey as RunKey
from ._store import Store as Store
from ._store import checksum as checksum
from ._store import fingerprint as fingerprint

__all__ = [
    "Audit",
    "Holder",
    "Plan",
    "RunLock",
    "RunKey",
    "Store",
    "VERSION",
    "audit",
    "checksum",
    "collect",
    "fingerprint",
    "run_lock",
    "run_pairs",
    "run_whole",
]
