"""The record codec: a stored row's bytes, written and read back, sealed by a checksum.

A record is a dict: numpy arrays go into an `.npz` blob (exact bytes, no pickle), everything else into
JSON (tuples are kept as tuples). Every record, and every run's metadata, is sealed (`sealed`): its text
carries a checksum over its JSON and its blob, so a row whose bytes changed after it was written reads
as *damaged* (`damage`, `read_record`, `read_meta` say why), never as other numbers. SQLite's text is
read through `sqlite_text`, so a byte that is not UTF-8 fails a checksum (or `sound_key`, for a run key)
instead of raising inside sqlite3.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._keys import digest

if TYPE_CHECKING:
    from ._keys import RunKey

_PREFIX, _MIDDLE, _SUM = '{"__sha256__": "', '", "__record__": ', 24
"""A sealed record's text is `{"__sha256__": "<24 hex>", "__record__": <the record's JSON>}`."""
_MARKS = ('"__sha256__"', '"__record__"')
"""Either one in a text that does not start as a sealed one: its envelope's head is damaged."""


def _seal(inner: bytes, blob: bytes | None) -> str:
    return digest([inner, b"-" if blob is None else b"+" + blob])


def sealed(inner: str, blob: bytes | None) -> str:
    """`inner` (a record's JSON text) in its checksum envelope, the checksum over the exact bytes of `inner`
    and of `blob`.

    Why an envelope in the record's own column, not a checksum column: the tables keep their columns
    (`COLUMNS` in audit/_store.py), so a store written before checksums opens as it is, with no migration
    (no write lock on open, no race between processes migrating one file, nothing to do on a read-only file
    system), and an older rewardlens still opens a store this one wrote. A record without an envelope (written before
    checksums) is read as it was then."""
    return f"{_PREFIX}{_seal(inner.encode(), blob)}{_MIDDLE}{inner}}}"


def _unsealed(text: object, blob: object) -> tuple[str | None, bool, str]:
    """A stored row's record JSON: (inner, True, '') when its checksum holds, (text, False, '') for a record
    written before checksums, (None, False, why) when the row is damaged."""
    if not isinstance(text, str):
        return None, False, "its record is not text"
    if blob is not None and not isinstance(blob, bytes):
        return None, False, "its arrays are not a blob"
    if not text.startswith(_PREFIX):
        if any(mark in text for mark in _MARKS):
            return None, False, "its checksum envelope is damaged"
        return text, False, ""
    head = len(_PREFIX) + _SUM
    stored, inner = text[len(_PREFIX):head], text[head + len(_MIDDLE):-1]
    if text[head:head + len(_MIDDLE)] != _MIDDLE or not text.endswith("}"):
        return None, False, "its checksum envelope is damaged"
    # surrogateescape gives back the exact bytes SQLite holds, valid UTF-8 or not (`sqlite_text`)
    if _seal(inner.encode("utf-8", "surrogateescape"), blob) != stored:
        return None, False, "its checksum does not match its bytes"
    return inner, True, ""


def sqlite_text(raw: bytes) -> str:
    """SQLite's text as a str that never fails to decode: a byte that is not UTF-8 (a damaged row) becomes a
    lone surrogate, which a checksum then rejects, instead of an error raised inside sqlite3."""
    return raw.decode("utf-8", "surrogateescape")


def encode_record(record: Mapping[str, Any]) -> tuple[str, bytes | None]:
    """A record as (sealed JSON text, `.npz` blob of its arrays or None)."""
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
        return sealed(text, None), None
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=True, **arrays)  # numpy's default, named so the stub does not read **arrays as it
    blob = buf.getvalue()
    return sealed(text, blob), blob


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
        raise ValueError(f"a record is a JSON object, got {type(record).__name__}")
    return record


def read_record(text: object, blob: object) -> tuple[dict[str, Any] | None, str]:
    """A stored row's record, or (None, why) when it is damaged: its checksum fails, or its text or blob
    does not decode (bad JSON, a bad zip or CRC, a missing array)."""
    inner, _, why = _unsealed(text, blob)
    if inner is None:
        return None, why
    try:
        inner.encode("utf-8")  # a lone surrogate: bytes that were never UTF-8 (`sqlite_text`)
        return _decode(inner, blob if isinstance(blob, bytes) else None), ""
    except Exception as exc:  # damaged bytes fail each parser (json, zip, npy) its own way: all mean damaged
        return None, f"it does not decode: {type(exc).__name__}: {' '.join(str(exc).split())}"


def damage(text: object, blob: object) -> str:
    """Why a stored row is damaged ('' when it is sound). A sealed row is vouched for by its checksum (the
    bytes are the ones written, which decoded); one written before checksums is decoded to tell."""
    inner, checked, why = _unsealed(text, blob)
    if inner is None or checked:
        return why
    return read_record(text, blob)[1]


def read_meta(text: object) -> tuple[dict[str, Any] | None, str]:
    """A run's metadata, or (None, why) when it is damaged (sealed like a record, with no blob)."""
    inner, _, why = _unsealed(text, None)
    if inner is None:
        return None, why
    try:
        meta = json.loads(inner)
    except ValueError as exc:
        return None, f"it does not decode: {exc}"
    return (meta, "") if isinstance(meta, dict) else (None, "it is not a JSON object")


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

