"""The results store: SQLite, one row per (run, unit), committed as each unit finishes.

A run is keyed by what its numbers depend on: the model's fingerprint (config, dtype and head
weights), a checksum of the data, the instrument and its version. A unit is one pair (per-pair
instruments) or `all` (whole-model ones). Each write is one transaction, so a process killed at
any moment leaves every finished unit intact and no half-written one; a resumed run asks `done`
and skips what is there. Shards written by separate processes merge with `merge`, which refuses
two different answers for the same unit instead of keeping either.

Records are dicts: numpy arrays go into an `.npz` blob (exact bytes, no pickle), everything else
into JSON (tuples are kept as tuples).

Any number of processes may open (and create) one store at once, e.g. torchrun ranks. SQLite's
"database is locked" is a transient state, never a broken file: switching to WAL can report it
without waiting on the busy timeout, so each step of opening is retried with a bounded backoff
until the store's timeout, and only then fails, as `StoreLockedError`. "Not a results store" is
said only of a file SQLite cannot read as a database or one holding another program's tables, and
such a file is never touched.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..errors import StoreError, StoreLockedError

if TYPE_CHECKING:
    from ..model import RewardModel

_T = TypeVar("_T")

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY,
    model TEXT NOT NULL, data TEXT NOT NULL, instrument TEXT NOT NULL, version TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    UNIQUE (model, data, instrument, version)
)""",
    """CREATE TABLE IF NOT EXISTS units (
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    unit TEXT NOT NULL, position INTEGER NOT NULL, record TEXT NOT NULL, arrays BLOB,
    PRIMARY KEY (run_id, unit)
)""",
)
"""The two tables, each statement on its own: they are run inside one explicit transaction."""
COLUMNS = {"runs": ("run_id", "model", "data", "instrument", "version", "meta"),
           "units": ("run_id", "unit", "position", "record", "arrays")}
"""Each table's columns, in order: what tells a results store from another program's database."""


def _is_lock(exc: BaseException) -> bool:
    """True for SQLite's busy/locked errors: another connection holds a lock, the file is fine."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    name = getattr(exc, "sqlite_errorname", "")
    text = str(exc).lower()
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text or "busy" in text


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


def _digest(parts: Iterable[bytes]) -> str:
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
    return _digest(parts)[:12]


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
    return _digest(parts + _kind(model))


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
    reference = [] if model.reference is None else [fingerprint(model.reference).encode()]
    return [json.dumps(kind, default=str).encode(), *reference]


def checksum(items: Sequence[Any]) -> str:
    """Hash of the data: every item's fields (dataclasses such as `Pair`), in order.

    Optional fields left at None are not hashed, so a field added later (`Pair.group`) leaves the
    checksum of data that does not use it unchanged and older stores resume."""
    canon = [_fields(x) if is_dataclass(x) and not isinstance(x, type) else x for x in items]
    return _digest([json.dumps(canon, sort_keys=True, default=str).encode()])


def _fields(item: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(item).items() if not (k in _LATER_FIELDS and v is None)}


_LATER_FIELDS = frozenset({"group"})
"""Fields added to `Pair` after stores were written: hashed only when set."""


def _encode(record: Mapping[str, Any]) -> tuple[str, bytes | None]:
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
        return text, None
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=True, **arrays)  # numpy's default, named so the stub does not read **arrays as it
    return text, buf.getvalue()


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

    return unpack(json.loads(text))


class Store:
    """A results store in one SQLite file (created on first use). Safe to open, create and write
    from several processes at once; each `write` is atomic.

    `timeout`: seconds to wait on another process's lock (opening or writing) before
    `StoreLockedError`."""

    def __init__(self, path: str | Path, *, timeout: float = 120.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._unreadable(exc) from exc
        try:
            ours = self._retry(self._schema)  # read only: another program's file is refused untouched
            self._retry(lambda: self._db.execute("PRAGMA journal_mode=WAL").fetchone())
            if not ours:
                self._retry(self._create)
        except BaseException:
            self._db.close()
            raise

    def _schema(self) -> bool:
        """Whether the file already holds both tables; `StoreError` when it holds another program's."""
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        foreign = sorted(t for t in tables if t not in COLUMNS and not t.startswith("sqlite_"))
        wrong = [t for t in COLUMNS if t in tables
                 and tuple(r[1] for r in self._db.execute(f"PRAGMA table_info({t})")) != COLUMNS[t]]
        if wrong or (foreign and not set(COLUMNS) <= tables):
            found = ", ".join(wrong + foreign)
            raise StoreError(f"{self.path} is not a rewardlens results store (it holds another program's "
                             f"tables: {found}); the file was left untouched — point --store at a new file")
        return set(COLUMNS) <= tables

    def _create(self) -> None:
        """Both tables in one transaction; IF NOT EXISTS makes a concurrent creator harmless. A
        lock error is left to `_retry` (hence no `_transaction`), with nothing left open."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for statement in SCHEMA:
                self._db.execute(statement)
            self._db.execute("COMMIT")
        finally:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")

    def _retry(self, step: Callable[[], _T]) -> _T:
        """Run `step`, retrying while another connection holds a lock, until `timeout` has passed.

        SQLite waits on its busy timeout for most locks, but not all: changing the journal mode,
        or a reader meeting a WAL being set up, fails at once with "database is locked". Those are
        retried after a short randomised backoff (so racing processes do not retry in lockstep).
        """
        deadline = time.monotonic() + self.timeout
        delay, left = 0.001, self.timeout
        try:
            while True:
                try:
                    # SQLite's own wait ends at the deadline too, so the whole open is bounded by `timeout`
                    self._db.execute(f"PRAGMA busy_timeout = {max(1, int(left * 1000))}")
                    return step()
                except sqlite3.Error as exc:
                    left = deadline - time.monotonic()
                    if not _is_lock(exc):
                        raise self._unreadable(exc) from exc
                    if left <= 0:
                        raise self._locked() from exc
                time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
                delay = min(2 * delay, 0.1)
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")

    def _locked(self) -> StoreLockedError:
        return StoreLockedError(
            f"{self.path} is locked: another process is writing it and held its lock for more than the "
            f"{self.timeout:g} s timeout. The store is not damaged; wait for the other run to finish "
            "(or give a longer timeout) and run again")

    def _unreadable(self, exc: sqlite3.Error) -> StoreError:
        if "not a database" in str(exc):
            return StoreError(f"{self.path} is not a rewardlens results store (SQLite: {exc}); the file was "
                              "left untouched — point --store at a new file")
        return StoreError(f"{self.path} cannot be opened as a results store (SQLite: {exc}); the file was "
                          "left untouched — check the path and its permissions, or point --store at a new file")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (waiting up to `timeout`)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _is_lock(exc):
                raise self._locked() from exc
            raise
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _run_id(self, db: sqlite3.Connection, key: RunKey, meta: Mapping[str, Any] | None = None) -> int:
        row = db.execute("SELECT run_id FROM runs WHERE model=? AND data=? AND instrument=? AND version=?",
                         (key.model, key.data, key.instrument, key.version)).fetchone()
        if row is not None:
            return row[0]
        cur = db.execute("INSERT INTO runs (model, data, instrument, version, meta) VALUES (?, ?, ?, ?, ?)",
                         (key.model, key.data, key.instrument, key.version, json.dumps(meta or {})))
        assert cur.lastrowid is not None  # an INSERT sets it
        return cur.lastrowid

    def runs(self) -> list[tuple[RunKey, dict[str, Any]]]:
        """Every run in the store with its metadata."""
        rows = self._db.execute("SELECT model, data, instrument, version, meta FROM runs ORDER BY run_id")
        return [(RunKey(*r[:4]), json.loads(r[4])) for r in rows]

    def meta(self, key: RunKey) -> dict[str, Any] | None:
        row = self._db.execute("SELECT meta FROM runs WHERE model=? AND data=? AND instrument=? AND version=?",
                               (key.model, key.data, key.instrument, key.version)).fetchone()
        return None if row is None else json.loads(row[0])

    def done(self, key: RunKey) -> set[str]:
        """Units of `key` already stored."""
        rows = self._db.execute(
            "SELECT unit FROM units JOIN runs USING (run_id) WHERE model=? AND data=? AND instrument=? AND version=?",
            (key.model, key.data, key.instrument, key.version))
        return {r[0] for r in rows}

    def write(self, entries: Iterable[tuple[RunKey, str, int, Mapping[str, Any]]],
              meta: Mapping[RunKey, Mapping[str, Any]] | None = None) -> None:
        """Store `(key, unit, position, record)` entries in one transaction: all or none.

        `position` orders a run's units when read back (a pair's index). Writing a unit that is
        already stored is a bug in the caller (a resumed run must skip it) and raises.
        """
        encoded = [(key, unit, pos, *_encode(rec)) for key, unit, pos, rec in entries]
        with self._transaction() as db:
            for key, unit, pos, text, blob in encoded:
                run = self._run_id(db, key, (meta or {}).get(key))
                try:
                    db.execute("INSERT INTO units VALUES (?, ?, ?, ?, ?)", (run, unit, pos, text, blob))
                except sqlite3.IntegrityError as exc:
                    raise StoreError(f"unit {unit!r} of {key.instrument} is already stored in {self.path}; "
                                     "a resumed run must skip finished units") from exc

    def records(self, key: RunKey) -> list[tuple[str, dict[str, Any]]]:
        """`(unit, record)` of every stored unit of `key`, in position order."""
        rows = self._db.execute(
            "SELECT unit, record, arrays FROM units JOIN runs USING (run_id) "
            "WHERE model=? AND data=? AND instrument=? AND version=? ORDER BY position, unit",
            (key.model, key.data, key.instrument, key.version))
        return [(unit, _decode(text, blob)) for unit, text, blob in rows]

    def merge(self, other: str | Path | Store) -> int:
        """Copy every unit of `other` (another process's shard) into this store; returns how many
        were new. A unit present in both must hold the same bytes, else `StoreError`."""
        src = other if isinstance(other, Store) else Store(other)
        added = 0
        try:
            with self._transaction() as db:
                for key, meta in src.runs():
                    run = self._run_id(db, key, meta)
                    rows = src._db.execute(
                        "SELECT unit, position, record, arrays FROM units JOIN runs USING (run_id) "
                        "WHERE model=? AND data=? AND instrument=? AND version=?",
                        (key.model, key.data, key.instrument, key.version)).fetchall()
                    for unit, pos, text, blob in rows:
                        have = db.execute("SELECT record, arrays FROM units WHERE run_id=? AND unit=?",
                                          (run, unit)).fetchone()
                        if have is None:
                            db.execute("INSERT INTO units VALUES (?, ?, ?, ?, ?)", (run, unit, pos, text, blob))
                            added += 1
                        elif have != (text, blob):
                            raise StoreError(f"unit {unit!r} of {key.instrument} differs between {src.path} and "
                                             f"{self.path}; the shards were not computed from the same model and data")
        finally:
            if src is not other:
                src.close()
        return added
