"""The record codec: a stored row's bytes, written and read back, sealed by a checksum bound to where they belong.

A record is a dict: numpy arrays go into an `.npz` blob (exact bytes, no pickle), everything else into
JSON (tuples are kept as tuples). Every record, and every run's metadata, is sealed (`sealed`): its text
carries a checksum over its run's key, its unit, its JSON and its blob, so a row whose bytes changed after
it was written, or that sits under another run or unit than it was written for (rows swapped, re-keyed or
moved by a tool), reads as *damaged* (`state`, `read_record`, `read_meta` say why), never as other numbers.
A row written before records were bound to their key (`UNBOUND`: the older envelope, whose checksum covers
its bytes only, or none at all) opens, but its key cannot be verified, so it is never read as numbers either:
the audit computes it again. SQLite's text is read through `sqlite_text`, so a byte that is not UTF-8 fails a
checksum (or `sound_key`, for a run key) instead of raising inside sqlite3.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import StoreError
from ._keys import digest

if TYPE_CHECKING:
    from ._keys import RunKey

_BOUND, _OLDER, _MIDDLE, _SUM = '{"__bound__": "', '{"__sha256__": "', '", "__record__": ', 24
"""A sealed record's text is `{"__bound__": "<24 hex>", "__record__": <the record's JSON>}`; one written before
records were bound to their key has `__sha256__` in its place, a checksum over its bytes only."""
_MARKS = ('"__bound__"', '"__sha256__"', '"__record__"')
"""Any one in a text that does not start as a sealed one: its envelope's head is damaged."""
UNBOUND = "it was written before records were bound to their key, so its key cannot be verified"
"""`state` of a row that is intact but unbound (an older rewardlens wrote it): not damaged, and not trusted."""
_MOVED = "its checksum does not match its bytes, or the run and unit it is filed under"


def _where(key: RunKey, unit: str | None) -> list[bytes]:
    """What a seal binds besides the bytes: the run's key, and the unit (None: the run's metadata). A unit's
    name read from a damaged file may hold bytes that are not UTF-8 (`sqlite_text`): kept, so they differ."""
    place = [b"unit", unit.encode("utf-8", "surrogateescape")] if unit is not None else [b"meta"]
    return [b"rewardlens record", *(str(p).encode() for p in vars(key).values()), *place]


def _seal(inner: bytes, blob: bytes | None, where: list[bytes]) -> str:
    return digest([*where, inner, b"-" if blob is None else b"+" + blob])


def sealed(inner: str, blob: bytes | None, key: RunKey, unit: str | None) -> str:
    """`inner` (a record's JSON text) in its checksum envelope: the checksum over `key`'s four parts, `unit`
    (None for a run's metadata) and the exact bytes of `inner` and of `blob`.

    Why an envelope in the record's own column, not a checksum column: the tables keep their columns
    (`COLUMNS` in audit/_sqlite.py), so an older store opens as it is, with no migration (no write lock on open,
    no race between processes migrating one file, nothing to do on a read-only file system). An older
    rewardlens still opens a store this one wrote, and reads its rows as damaged (another envelope), so it
    computes them again rather than misreading them."""
    return f"{_BOUND}{_seal(inner.encode(), blob, _where(key, unit))}{_MIDDLE}{inner}}}"


def _unsealed(text: object, blob: object, key: RunKey, unit: str | None) -> tuple[str | None, str]:
    """A stored row's record JSON and its state: (inner, '') when its checksum holds for `key` and `unit`,
    (inner, UNBOUND) for a record written before records were bound to their key (its older checksum, if any,
    holding), (None, why) when the row is damaged."""
    if not isinstance(text, str):
        return None, "its record is not text"
    if blob is not None and not isinstance(blob, bytes):
        return None, "its arrays are not a blob"
    prefix = next((p for p in (_BOUND, _OLDER) if text.startswith(p)), None)
    if prefix is None:
        if any(mark in text for mark in _MARKS):
            return None, "its checksum envelope is damaged"
        return text, UNBOUND  # written before checksums
    head = len(prefix) + _SUM
    stored, inner = text[len(prefix):head], text[head + len(_MIDDLE):-1]
    if text[head:head + len(_MIDDLE)] != _MIDDLE or not text.endswith("}"):
        return None, "its checksum envelope is damaged"
    # surrogateescape gives back the exact bytes SQLite holds, valid UTF-8 or not (`sqlite_text`)
    raw = inner.encode("utf-8", "surrogateescape")
    if prefix == _OLDER:
        ok = _seal(raw, blob, []) == stored  # the older checksum: over the bytes alone
        return (inner, UNBOUND) if ok else (None, "its checksum does not match its bytes")
    if _seal(raw, blob, _where(key, unit)) != stored:
        return None, _MOVED
    return inner, ""


def sqlite_text(raw: bytes) -> str:
    """SQLite's text as a str that never fails to decode: a byte that is not UTF-8 (a damaged row) becomes a
    lone surrogate, which a checksum then rejects, instead of an error raised inside sqlite3."""
    return raw.decode("utf-8", "surrogateescape")


def encode_record(record: Mapping[str, Any], key: RunKey, unit: str) -> tuple[str, bytes | None]:
    """A record as (JSON text sealed for `key` and `unit`, `.npz` blob of its arrays or None)."""
    arrays: dict[str, np.ndarray] = {}

    def pack(value: Any, path: str) -> Any:
        if isinstance(value, np.ndarray):
            arrays[path] = value
            return {"__array__": path}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, tuple):
            return {"__tuple__": [pack(v, f"{path}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [pack(v, f"{path}.{i}") for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            return {str(k): pack(v, f"{path}.{k}") for k, v in value.items()}
        return value

    text = json.dumps(pack(dict(record), "r"))
    if not arrays:
        return sealed(text, None, key, unit), None
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=True, **arrays)  # numpy's default, named so the stub does not read **arrays as it
    blob = buf.getvalue()
    return sealed(text, blob, key, unit), blob


def _decode(text: str, blob: bytes | None) -> dict[str, Any]:
    arrays = np.load(io.BytesIO(blob), allow_pickle=False) if blob else {}

    def unpack(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {"__array__"}:
                return arrays[value["__array__"]]
            if set(value) == {"__tuple__"}:
                return tuple(unpack(v) for v in value["__tuple__"])
            return {k: unpack(v) for k, v in value.items()}
        if isinstance(value, list):
            return [unpack(v) for v in value]
        return value

    record = unpack(json.loads(text))
    if not isinstance(record, dict):
        raise StoreError(f"a record is a JSON object, got {type(record).__name__}")
    return record


def read_record(text: object, blob: object, key: RunKey, unit: str) -> tuple[dict[str, Any] | None, str]:
    """A stored row's record, filed under `key` and `unit`; (None, why) when it is damaged: its checksum fails
    (for its bytes or for where it is filed), or its text or blob does not decode (bad JSON, a bad zip or CRC,
    a missing array); (None, UNBOUND) when it is intact but was written before records were bound to their key."""
    inner, why = _unsealed(text, blob, key, unit)
    if inner is None:
        return None, why
    try:
        inner.encode("utf-8")  # a lone surrogate: bytes that were never UTF-8 (`sqlite_text`)
        record = _decode(inner, blob if isinstance(blob, bytes) else None)
    except Exception as exc:  # damaged bytes fail each parser (json, zip, npy) its own way: all mean damaged
        return None, f"it does not decode: {type(exc).__name__}: {' '.join(str(exc).split())}"
    return (None, why) if why else (record, "")


def state(text: object, blob: object, key: RunKey, unit: str) -> str:
    """'' when a stored row is sound where it is filed (`key`, `unit`), `UNBOUND` when it is intact but
    unbound, else why it is damaged. A bound row is vouched for by its checksum (the bytes are the ones
    written there, which decoded); an unbound one is decoded to tell."""
    inner, why = _unsealed(text, blob, key, unit)
    if inner is None or not why:
        return why
    return read_record(text, blob, key, unit)[1]


def read_meta(text: object, key: RunKey) -> tuple[dict[str, Any] | None, str]:
    """The metadata of the run `key`: (meta, '') when sound, (meta, UNBOUND) when written before metadata was
    bound to its run's key, (None, why) when damaged (sealed like a record, with no blob)."""
    inner, why = _unsealed(text, None, key, None)
    if inner is None:
        return None, why
    try:
        meta = json.loads(inner)
    except ValueError as exc:
        return None, f"it does not decode: {exc}"
    return (meta, why) if isinstance(meta, dict) else (None, "it is not a JSON object")


def sound_key(key: RunKey) -> bool:
    """Whether a run key read from a file is text as written (no byte that is not UTF-8: `sqlite_text`)."""
    parts = list(vars(key).values())
    if not all(isinstance(p, str) for p in parts):
        return False
    try:
        "".join(parts).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

