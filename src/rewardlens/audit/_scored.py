"""The probes' scored sequences in the results store, chunk by chunk as they finish (`probe_memo`), so an audit
killed mid-probe resumes without scoring a stored sequence again (hacking/_scored.py cuts the chunks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hacking.internal import Chunks
from ..model import RewardModel
from ._keys import RunKey, fingerprint
from ._plan import VERSION, Plan
from ._store import Store

SEQUENCES = "sequences-by-content"
"""The `data` of the probe chunks' run key: a chunk is named by its sequences' token ids (`chunk_unit`), so one
run holds the chunks of every audit of the model, whatever its pairs (a sequence's reward depends on none)."""


def scored_key(model: RewardModel, plan: Plan) -> RunKey:
    """Where the probes' chunks of `plan` are stored: by the read they come from (through the concepts' shared
    cache, which keeps every depth, or the plain loop: their numbers differ in the last bits) and its batch size
    (the audit's probes score in batches of `2 * plan.batch_size`)."""
    read = "reads" if plan.concepts else "rewards"
    return RunKey(fingerprint(model), SEQUENCES, f"probes/scored/{read}/batch-{2 * plan.batch_size}", VERSION)


def probe_memo(model: RewardModel, store: Store, plan: Plan) -> Chunks:
    """`probe(memo=)` for the audit: each chunk read from `store` when stored and sound (a damaged one is
    scored again and replaces it), else written to it in one transaction as soon as it is scored."""
    key = scored_key(model, plan)

    def load(unit: str) -> Mapping[str, Any] | None:
        if unit not in store.status(key, [unit]).done:  # a damaged unit is seen here, so the write may replace it
            return None
        return store.records(key, [unit])[0][1]

    def save(unit: str, record: dict[str, Any]) -> None:
        store.write([(key, unit, 0, record)])

    return Chunks(load, save)


def stored_chunks(model: RewardModel, store: Store, plan: Plan) -> int:
    """How many chunks of probe sequences `store` holds, sound, for `plan`'s read (the resume message says it)."""
    return len(store.done(scored_key(model, plan)))
