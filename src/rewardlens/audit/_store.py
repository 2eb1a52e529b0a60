"""The results store: SQLite, one row per (run, unit), committed as each unit finishes.

A run is keyed by what its numbers depend on: the model's fingerprint (config, dtype and head
weights), the data, the instrument and its version. A unit is one pair, named by its content
(`content_key`: per-pair instruments), or `all` (whole-model ones). Each write is one transaction,
so a process killed at any moment leaves every finished unit intact and no half-written one; a
resumed run asks `done` and skips what is there. Shards written by separate processes merge with
`merge`, which refuses two different answers for the same unit instead of keeping either.

Records are dicts: numpy arrays go into an `.npz` blob (exact bytes, no pickle), everything else
into JSON (tuples are kept as tuples). Every record, and every run's metadata, carries a checksum
over its JSON text and its blob (the codec: audit/_records.py): a unit whose bytes changed after it
was written (a bad disk, a torn copy, a flipped bit) reads as *damaged*, never as other numbers.
`done` leaves a damaged unit out, so a rerun computes it again, and `write` may replace it (and only
it); `records` refuses it by name (`StoreError`); `merge` refuses to copy it.

Any number of processes may open (and create) one store at once, e.g. torchrun ranks. SQLite's
"database is locked" is a transient state, never a broken file: switching to WAL can report it
without waiting on the busy timeout, so each step of opening is retried with a bounded backoff
until the store's timeout, and only then fails, as `StoreLockedError`. "Not a results store" is
said only of a file SQLite cannot read as a database or one holding another program's tables, and
such a file is never touched. "Damaged" is said of a unit whose checksum fails, and of the whole
file only when SQLite itself cannot read its pages ("database disk image is malformed").
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import RewardLensWarning, StoreError
from ._keys import RunKey
from ._records import damage, encode_record, read_meta, read_record, sealed, sound_key, sqlite_text
from ._sqlite import is_lock, locked, unreadable

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


_SLICE = 500
"""Units asked for in one statement (SQLite caps the variables of a statement at 999 in old builds)."""


@dataclass(frozen=True)
class Units:
    """What a store holds of one run's units: the sound ones, and the damaged ones with why."""

    done: frozenset[str] = frozenset()
    """Units stored and sound: a rerun reads them."""
    damaged: Mapping[str, str] = field(default_factory=dict)
    """Unit → why it is damaged (its checksum fails, it does not decode, its run's metadata is damaged): a
    rerun computes it again and replaces it."""


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
            raise unreadable(self.path, exc) from exc
        self._db.text_factory = sqlite_text
        self._seen: set[tuple[RunKey, str]] = set()
        """Units `status` found damaged through this connection: `write` may replace them (also once a damaged
        metadata they were damaged with is rewritten by an earlier write, and the rows read sound again)."""
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
            damaged = "" if foreign else ", or a results store whose schema is damaged"
            raise StoreError(f"{self.path} is not a rewardlens results store (it holds another program's "
                             f"tables: {found}){damaged}; the file was left untouched — point --store at a new file")
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
                except UnicodeDecodeError as exc:  # SQLite's error message quoting a damaged schema's bytes
                    raise unreadable(self.path, exc) from exc
                except sqlite3.Error as exc:
                    left = deadline - time.monotonic()
                    if not is_lock(exc):
                        raise unreadable(self.path, exc) from exc
                    if left <= 0:
                        raise locked(self.path, self.timeout) from exc
                time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
                delay = min(2 * delay, 0.1)
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        """SQLite's errors as the store's own: a lock past the timeout, a damaged file, anything else."""
        try:
            yield
        except UnicodeDecodeError as exc:  # SQLite's error message quoting a damaged schema's bytes
            raise unreadable(self.path, exc) from exc
        except sqlite3.Error as exc:
            raise (locked(self.path, self.timeout) if is_lock(exc) else unreadable(self.path, exc)) from exc

    def _damaged(self, key: RunKey, unit: str, why: str, where: Path | None = None) -> str:
        return (f"unit {unit!r} of {key.instrument} in {where or self.path} is damaged ({why}); run the audit "
                "again with this store: it computes a damaged unit again and replaces it")

    def _damaged_meta(self, key: RunKey, why: str) -> str:
        return (f"the metadata of {key.instrument} in {self.path} is damaged ({why}); run the audit again with "
                "this store: it computes that run's units again and rewrites its metadata")

    def close(self) -> None:
        """Close the connection (every write is committed already)."""
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (waiting up to `timeout`)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if is_lock(exc):
                raise locked(self.path, self.timeout) from exc
            raise
        try:
            yield self._db
        except BaseException:
            if self._db.in_transaction:  # SQLite rolls some failures back itself
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _run_id(self, db: sqlite3.Connection, key: RunKey, meta: Mapping[str, Any] | None = None) -> tuple[int, bool]:
        """The run's id (the run added when new) and whether its metadata was damaged and is now `meta`: then
        every unit of the run was damaged with it, and may be replaced."""
        text = sealed(json.dumps(meta or {}), None)
        row = self._find(key)
        if row is None:
            cur = db.execute("INSERT INTO runs (model, data, instrument, version, meta) VALUES (?, ?, ?, ?, ?)",
                             (key.model, key.data, key.instrument, key.version, text))
            assert cur.lastrowid is not None  # an INSERT sets it
            return cur.lastrowid, False
        if read_meta(row[1])[0] is not None:
            return row[0], False
        db.execute("UPDATE runs SET meta=? WHERE run_id=?", (text, row[0]))
        return row[0], True

    def _find(self, key: RunKey) -> tuple[int, str] | None:
        """(run id, the metadata's stored text) of `key`, None when it has no run here."""
        row = self._db.execute(
            "SELECT run_id, meta, model, data, instrument, version FROM runs "
            "WHERE model=? AND data=? AND instrument=? AND version=?",
            (key.model, key.data, key.instrument, key.version)).fetchone()
        if row is not None and RunKey(*row[2:]) != key:  # found through the index, another key in the table
            said = f"the index of runs finds {key.instrument} at another run"
            raise unreadable(self.path, sqlite3.IntegrityError(said))
        return None if row is None else (row[0], row[1])

    def _rows(self, run: int, units: Collection[str] | None) -> list[tuple[str, Any, Any, Any]]:
        """(unit, position, record, arrays) of the run's rows (of `units` only, when given), in position order."""
        select = "SELECT unit, position, record, arrays, run_id FROM units WHERE run_id = ?"
        if units is None:
            rows = self._db.execute(select, (run,)).fetchall()
        else:
            wanted, rows = sorted(set(units)), []
            for s in range(0, len(wanted), _SLICE):
                part = wanted[s:s + _SLICE]
                rows += self._db.execute(f"{select} AND unit IN ({', '.join('?' * len(part))})", (run, *part))
        if any(r[4] != run or (units is not None and r[0] not in units) for r in rows):  # found through the index
            said = "the index of units finds rows the table holds elsewhere"
            raise unreadable(self.path, sqlite3.IntegrityError(said))
        # a damaged position column may hold any type: it orders, so it must not fail to
        return sorted((r[:4] for r in rows), key=lambda r: (r[1] if isinstance(r[1], int) else -1, str(r[0])))

    def keys(self) -> list[RunKey]:
        """Every run's key, in the order they were added."""
        with self._guarded():
            return [RunKey(*r) for r in
                    self._db.execute("SELECT model, data, instrument, version FROM runs ORDER BY run_id")]

    def runs(self) -> list[tuple[RunKey, dict[str, Any]]]:
        """Every run in the store with its metadata; `StoreError` naming a run whose metadata is damaged."""
        with self._guarded():
            rows = self._db.execute("SELECT model, data, instrument, version, meta FROM runs ORDER BY run_id")
            listed = [(RunKey(*r[:4]), r[4]) for r in rows]
        out = []
        for key, text in listed:
            meta, why = read_meta(text)
            if meta is None:
                raise StoreError(self._damaged_meta(key, why))
            out.append((key, meta))
        return out

    def meta(self, key: RunKey) -> dict[str, Any] | None:
        """The run's metadata (None when it has no run here); `StoreError` when it is damaged."""
        with self._guarded():
            found = self._find(key)
        if found is None:
            return None
        meta, why = read_meta(found[1])
        if meta is None:
            raise StoreError(self._damaged_meta(key, why))
        return meta

    def status(self, key: RunKey, units: Collection[str] | None = None) -> Units:
        """Which of `key`'s stored units (of `units` only, when given) are sound and which damaged. Every
        unit's checksum is verified (one written before checksums is decoded); a run whose metadata is
        damaged has every unit damaged."""
        with self._guarded():
            found = self._find(key)
            rows = [] if found is None else self._rows(found[0], units)
        if found is None:
            return Units()
        why_meta = read_meta(found[1])[1]
        why = {str(unit): f"its run's metadata is damaged: {why_meta}" if why_meta else damage(text, blob)
               for unit, _, text, blob in rows}
        damaged = {u: w for u, w in why.items() if w}
        self._seen.update((key, u) for u in damaged)
        return Units(frozenset(u for u, w in why.items() if not w), damaged)

    def done(self, key: RunKey, units: Collection[str] | None = None) -> set[str]:
        """Units of `key` stored and sound (of `units` only, when given); a damaged one is not done."""
        return set(self.status(key, units).done)

    def write(self, entries: Iterable[tuple[RunKey, str, int, Mapping[str, Any]]],
              meta: Mapping[RunKey, Mapping[str, Any]] | None = None) -> None:
        """Store `(key, unit, position, record)` entries in one transaction: all or none.

        `position` orders a run's units when read back. Writing a unit that is already stored and
        sound is a bug in the caller (a resumed run must skip it) and raises; a damaged one is replaced
        (one this connection's `status` found damaged, or one that reads damaged now).
        """
        encoded = [(key, unit, pos, *encode_record(rec)) for key, unit, pos, rec in entries]
        with self._guarded(), self._transaction() as db:
            runs: dict[RunKey, tuple[int, bool]] = {}
            for key, unit, pos, text, blob in encoded:
                if key not in runs:
                    runs[key] = self._run_id(db, key, (meta or {}).get(key))
                run, repaired = runs[key]
                self._put(db, key, run, (unit, pos, text, blob), replace=repaired)
        self._seen -= {(key, unit) for key, unit, *_ in encoded}  # committed: sound now, never replaced again

    def _put(self, db: sqlite3.Connection, key: RunKey, run: int, row: tuple[str, int, str, bytes | None],
             replace: bool) -> None:
        """Insert one unit, or replace the stored one when it is damaged (or `replace`); `StoreError` when a
        sound one is there."""
        unit, pos, text, blob = row
        try:
            db.execute("INSERT INTO units VALUES (?, ?, ?, ?, ?)", (run, unit, pos, text, blob))
            return
        except sqlite3.IntegrityError:
            have = db.execute("SELECT unit, record, arrays FROM units WHERE run_id=? AND unit=?",
                              (run, unit)).fetchone()
        if have is None or have[0] != unit:  # the unique index holds it, the table does not (or by another name)
            raise sqlite3.IntegrityError(f"the index of units holds {unit!r}, the table does not")
        if not replace and (key, unit) not in self._seen and not damage(*have[1:]):
            raise StoreError(f"unit {unit!r} of {key.instrument} is already stored in {self.path}; "
                             "a resumed run must skip finished units")
        db.execute("UPDATE units SET position=?, record=?, arrays=? WHERE run_id=? AND unit=?",
                   (pos, text, blob, run, unit))

    def records(self, key: RunKey, units: Collection[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
        """`(unit, record)` of every stored unit of `key` (of `units` only, when given), in position order;
        `StoreError` naming a damaged one (never its bytes read as numbers)."""
        with self._guarded():
            found = self._find(key)
            rows = [] if found is None else self._rows(found[0], units)
        if found is None:
            return []
        why_meta = read_meta(found[1])[1]
        meta_damage, out = f"its run's metadata is damaged: {why_meta}", []
        for unit, _, text, blob in rows:
            record, why = (None, meta_damage) if why_meta else read_record(text, blob)
            if record is None:
                raise StoreError(self._damaged(key, str(unit), why))
            out.append((str(unit), record))
        return out

    def merge(self, other: str | Path | Store) -> int:
        """Copy every unit of `other` (another process's shard) into this store; returns how many were new
        (or replaced a damaged one). A unit present in both must hold the same bytes, else `StoreError`;
        a damaged unit of `other` is refused by name, and nothing is merged."""
        src = other if isinstance(other, Store) else Store(other)
        try:
            runs = src.runs()
            with self._guarded(), self._transaction() as db:
                return sum(self._merge_run(db, src, key, meta) for key, meta in runs)
        finally:
            if src is not other:
                src.close()

    def _merge_run(self, db: sqlite3.Connection, src: Store, key: RunKey, meta: dict[str, Any]) -> int:
        """One run of `src` into this store, inside the caller's transaction; returns the units new or replaced."""
        if not sound_key(key):
            raise StoreError(f"a run key in {src.path} is damaged ({key}); nothing was merged — run the audit "
                             "again with this store: the rank computes its pairs again into a sound run")
        run, repaired = self._run_id(db, key, meta)
        found = src._find(key)
        assert found is not None  # listed by `src.runs()` a moment ago, in a shard no other process writes
        added, passed = 0, []
        for unit, pos, text, blob in src._rows(found[0], None):
            have = db.execute("SELECT record, arrays FROM units WHERE run_id=? AND unit=?", (run, unit)).fetchone()
            sound = have is not None and not repaired and not damage(*have)
            why = damage(text, blob)
            if why and not sound:
                raise StoreError(f"{self._damaged(key, str(unit), why, src.path)}; nothing was merged")
            if why:  # this store holds the unit sound already: the damaged copy would add nothing
                passed.append(f"{key.instrument} unit {unit!r}")
            elif sound and have != (text, blob):
                raise StoreError(f"unit {unit!r} of {key.instrument} differs between {src.path} and "
                                 f"{self.path}; the shards were not computed from the same model and data")
            elif have != (text, blob):
                self._put(db, key, run, (unit, pos, text, blob), replace=True)
                added += 1
        if passed:
            warnings.warn(f"{src.path}: {len(passed)} damaged unit(s) were not merged; {self.path} holds them sound "
                          f"already: {', '.join(passed[:8])}", RewardLensWarning, stacklevel=4)
        return added
