"""The keys a stored run and its units are found by, and `digest`, which every key and checksum is made with.

A run is keyed (`RunKey`) by the model's `fingerprint`, the data's `checksum`, the instrument and its
version (`schema_version` of the results it stores); a per-pair unit by its pair's `content_key`. A store
is resumed only by the same bytes: a change to what any of them hashes orphans every store written
before it (`_kind`'s bytes are pinned in tests/audit/test_store.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..data import Pair
    from ..model import RewardModel


@dataclass(frozen=True)
class RunKey:
    """What a run's numbers depend on."""

    model: str
    """Model fingerprint (`fingerprint`)."""
    data: str
    """Data checksum (`checksum`)."""
    instrument: str
    """Instrument name, with any options that change its numbers (`faithfulness/head/noising/read/total/seed-all`)."""
    version: str
    """Instrument version: bump it when its numbers would change."""


def digest(parts: Iterable[bytes]) -> str:
    """The first 24 hex digits of SHA-256 over `parts`, each preceded by its length (8 bytes, little-endian),
    so that no two different sequences of parts hash the same bytes."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:24]


def schema_version(revision: int, results: Sequence[type], extra: Sequence[str] = ()) -> str:
    """The store's schema version: a digest of `revision` (bumped by hand when a stored number changes
    meaning with no field changing), every stored result's name, fields (name and annotation) and
    storage declaration (`STORED`), and `extra` (column lists kept beside a result, such as the steps').

    A field added to, renamed in or moved between the chunked and the shared parts of any stored result
    changes it, so a store written before the change is never read as if it held the new field."""
    parts = [str(revision).encode(), *(s.encode() for s in extra)]
    for cls in results:
        declared = getattr(cls, "STORED", None)
        shape = [cls.__qualname__, [(f.name, str(f.type)) for f in fields(cls)], repr(declared)]
        parts.append(json.dumps(shape).encode())
    return digest(parts)[:12]


def fingerprint(model: RewardModel) -> str:
    """Hash of a `RewardModel`'s config, backbone dtype, read options and fp32 head weights.

    Backbone weights are not hashed (reading 70B parameters, some offloaded, would cost more
    than a sweep); the config, the head and the final norm tell fine-tunes of one backbone apart.
    """
    hf_config: Any = model.model.config  # a transformers PretrainedConfig
    config = json.dumps(hf_config.to_dict(), sort_keys=True, default=str)
    dtype = str(next(model.model.parameters()).dtype)
    options = json.dumps([model.pad_token_id, model.max_length, model.truncation, model.arch.name], default=str)
    head = model.head
    tensors = [head.weight, head.bias, head.readout, head.pooler_weight, head.pooler_bias, head.transform]
    if model.arch.final_norm is not None:  # a fine-tune often moves the final norm, not only the head
        norm = model.norm(model.arch.final_norm)  # read through accelerate when it is offloaded
        tensors += [norm.gamma, norm.beta]
    parts = [config.encode(), dtype.encode(), options.encode()]
    parts += [b"-" if t is None else t.detach().float().cpu().contiguous().numpy().tobytes() for t in tensors]
    return digest(parts + _kind(model))


def _kind(model: RewardModel) -> list[bytes]:
    """What defines a reward beyond one head read at one token: where it is read and combined, a judge's
    question, an LM head's rows or log-probability scale, and a DPO reference (by its own fingerprint).
    Nothing for a sequence-classification RM, so its fingerprint is what it always was. The bytes are
    pinned (tests/audit/test_store.py): a change here would orphan every store written before it."""
    head = model.head
    if model.kind.name == "classifier":  # its kind refuses a set of reads, a question and LM rows
        return []
    reads = model.reads
    kind = [reads.at, reads.separator, reads.combine, model.judge, head.tokens, head.scale, head.log_prob,
            model.offsets is not None]
    if reads.final != "append":  # how an open last step is read; hashed only off its default, so pins hold
        kind.append(reads.final)
    reference = [] if model.reference is None else [fingerprint(model.reference).encode()]
    return [json.dumps(kind, default=str).encode(), *reference]


def checksum(items: Sequence[Any]) -> str:
    """Hash of the data: every item's fields (dataclasses such as `Pair`), in order.

    Optional fields left at None are not hashed, so a field added later (`Pair.group`) leaves the
    checksum of data that does not use it unchanged and older stores resume."""
    canon = [_fields(x) if is_dataclass(x) and not isinstance(x, type) else x for x in items]
    return digest([json.dumps(canon, sort_keys=True, default=str).encode()])


def _fields(item: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(item).items()
            if k not in _UNHASHED and not (k in _LATER_FIELDS and v is None)}


_LATER_FIELDS = frozenset({"group"})
"""Fields added to `Pair` after stores were written: hashed only when set."""
_UNHASHED = frozenset({"extra"})
"""`Pair.extra` (the record's other fields) changes no number, so it is never hashed: a store written before
the loaders kept those fields resumes, and so does one whose data gained a column."""


def content_key(pair: Pair) -> str:
    """A pair's unit in the store: a digest of what its numbers depend on, its prompt, chosen and rejected
    response, and nothing else (not its id, subset or group, which change no number). The same pair is
    the same unit in any run of the same model, whatever its place in the pair set: a run of a subset,
    a superset or a reordering of pairs stored before reads them instead of computing them again."""
    return digest([json.dumps([pair.prompt, pair.chosen, pair.rejected], sort_keys=True).encode()])
