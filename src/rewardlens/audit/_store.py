"""The results store: SQLite, one row per (run, unit), committed as each unit finishes.

A run is keyed by what its numbers depend on: the model's fingerprint (config, dtype and head
weights), the data, the instrument and its version. A unit is one pair, named by its content
(`content_key`: per-pair instruments), or `all` (whole-model ones). Each write is one transaction,
so a process killed at any moment leaves every finished unit intact and no half-written one; a
resumed run asks `done` and skips what is there. Shards written by separate processes merge with
`merge`, which refuses two different answers for the same unit instead of keeping either.

Records are dicts (the codec: audit/_records.py). Every record, and every run's metadata, carries a
checksum over its run's key, its unit, its JSON text and its blob: a unit whose bytes changed after it was
written (a bad disk, a torn copy, a flipped bit), or that sits under another run or unit than it was written
for (rows swapped, re-keyed or moved by a tool), reads as *damaged*, never as other numbers. `done` leaves a
damaged unit out, so a rerun computes it again, and `write` may replace it (and only it, or an unbound one);
`records` refuses it by name (`StoreError`); `merge` refuses to copy it. A unit written before records were
bound to their key is *unbound*: it opens, but is neither done nor read nor merged; a rerun rewrites it.

Any number of processes may open (and create) one store at once, e.g. torchrun ranks. SQLite's
"database is locked" is a transient state, never a broken file: switching to WAL can report it
without waiting on the busy timeout, so each step of opening is retried with a bounded backoff
until the store's timeout, and only then fails, as `StoreLockedError`. "Not a results store" is
said only of a file SQLite cannot read as a database or one holding another program's tables, and
such a file is never touched. "Damaged" is said of a unit whose checksum fails, and of the whole
file when SQLite itself cannot read its pages ("database disk image is malformed") or a table is missing.
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
from ._records import UNBOUND, encode_record, read_meta, read_record, sealed, sound_key, sqlite_text, state
from ._sqlite import SCHEMA, is_lock, locked, schema, unreadable

_T = TypeVar("_T")

_SLICE = 500
"""Units asked for in one statement (SQLite caps the variables of a statement at 999 in old builds)."""


@dataclass(frozen=True)
class Units:
    """What a store holds of one run's units: the sound ones, the damaged ones with why, the unbound ones."""

    done: frozenset[str] = frozenset()
    """Units stored and sound: a rerun reads them."""
    damaged: Mapping[str, str] = field(default_factory=dict)
    """Unit → why it is damaged (its checksum fails, for its bytes or for the run and unit it is filed under;
    it does not decode; its run's metadata is damaged): a rerun computes it again and replaces it."""
    unbound: frozenset[str] = frozenset()
    """Units intact but written before records were bound to their key (an older rewardlens), or under such a
    run's metadata: their key cannot be verified, so a rerun computes them again and rewrites them, bound."""


def _verdict(key: RunKey, unit: str, why_meta: str, text: object, blob: object) -> str:
    """'' when a row of the run `key` is sound, `UNBOUND` when it is intact but unbound (or its run's metadata
    is: `why_meta`, the metadata's own `read_meta` state), else why it is damaged."""
    if why_meta not in ("", UNBOUND):
        return f"its run's metadata is damaged: {why_meta}"
    return state(text, blob, key, unit) or why_meta


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
        """Whether the file already holds both tables (`schema`)."""
        return schema(self._db, self.path)

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
        if why == UNBOUND:
            return (f"unit {unit!r} of {key.instrument} in {where or self.path} was written before records were "
                    "bound to their key (by an older rewardlens), so its key cannot be verified; run the audit "
                    "again with this store: it computes the unit again and rewrites it")
        return (f"unit {unit!r} of {key.instrument} in {where or self.path} is damaged ({why}); run the audit "
                "again with this store: it computes a damaged unit again and replaces it")

    def _damaged_meta(self, key: RunKey, why: str) -> str:
        said = "was written before records were bound to their key" if why == UNBOUND else f"is damaged ({why})"
        return (f"the metadata of {key.instrument} in {self.path} {said}; run the audit again with this store: it "
                "computes that run's units again and rewrites its metadata")

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
        """The run's id (the run added when new) and whether its metadata was damaged or unbound and is now
        `meta`: then every unit of the run was damaged (or unbound) with it, and may be replaced.

        A new run takes an id no row of `units` holds: rows left under the id of a run whose row is gone (deleted
        by a tool) are never adopted by another run, and stay where they are."""
        text = sealed(json.dumps(meta or {}), None, key, None)
        row = self._find(key)
        if row is None:
            cur = db.execute("INSERT INTO runs (run_id, model, data, instrument, version, meta) VALUES ("
                             "1 + max(coalesce((SELECT max(run_id) FROM runs), 0), coalesce((SELECT max(run_id) FROM "
                             "units WHERE typeof(run_id) = 'integer'), 0)), ?, ?, ?, ?, ?)",
                             (key.model, key.data, key.instrument, key.version, text))
            assert cur.lastrowid is not None  # an INSERT sets it
            return cur.lastrowid, False
        if read_meta(row[1], key)[1] == "":
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
        """Every run in the store with its metadata as stored (that of a run written before metadata was bound
        to its key included: `meta` refuses it); `StoreError` naming a run whose metadata is damaged."""
        with self._guarded():
            rows = self._db.execute("SELECT model, data, instrument, version, meta FROM runs ORDER BY run_id")
            listed = [(RunKey(*r[:4]), r[4]) for r in rows]
        out = []
        for key, text in listed:
            meta, why = read_meta(text, key)
            if meta is None:
                raise StoreError(self._damaged_meta(key, why))
            out.append((key, meta))
        return out

    def meta(self, key: RunKey) -> dict[str, Any] | None:
        """The run's metadata (None when it has no run here); `StoreError` when it is damaged, or written before
        metadata was bound to its run's key."""
        with self._guarded():
            found = self._find(key)
        if found is None:
            return None
        meta, why = read_meta(found[1], key)
        if meta is None or why:
            raise StoreError(self._damaged_meta(key, why))
        return meta

    def status(self, key: RunKey, units: Collection[str] | None = None) -> Units:
        """Which of `key`'s stored units (of `units` only, when given) are sound, which damaged and which
        unbound. Every unit's checksum is verified for its bytes and for the run and unit it is filed under (an
        unbound one is decoded); a run whose metadata is damaged has every unit damaged, and one whose
        metadata is unbound every intact unit unbound."""
        with self._guarded():
            found = self._find(key)
            rows = [] if found is None else self._rows(found[0], units)
        if found is None:
            return Units()
        why_meta = read_meta(found[1], key)[1]
        why = {str(unit): _verdict(key, str(unit), why_meta, text, blob) for unit, _, text, blob in rows}
        damaged = {u: w for u, w in why.items() if w and w != UNBOUND}
        unbound = frozenset(u for u, w in why.items() if w == UNBOUND)
        self._seen.update((key, u) for u in why if why[u])
        return Units(frozenset(u for u, w in why.items() if not w), damaged, unbound)

    def done(self, key: RunKey, units: Collection[str] | None = None) -> set[str]:
        """Units of `key` stored and sound (of `units` only, when given); a damaged or unbound one is not done."""
        return set(self.status(key, units).done)

    def write(self, entries: Iterable[tuple[RunKey, str, int, Mapping[str, Any]]],
              meta: Mapping[RunKey, Mapping[str, Any]] | None = None) -> None:
        """Store `(key, unit, position, record)` entries in one transaction: all or none.

        `position` orders a run's units when read back. Writing a unit that is already stored and
        sound is a bug in the caller (a resumed run must skip it) and raises; a damaged or unbound one is
        replaced (one this connection's `status` found so, or one that reads so now), and written bound.
        """
        encoded = [(key, unit, pos, *encode_record(rec, key, unit)) for key, unit, pos, rec in entries]
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
        if not replace and (key, unit) not in self._seen and not state(have[1], have[2], key, unit):
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
        why_meta, out = read_meta(found[1], key)[1], []
        for unit, _, text, blob in rows:
            why = _verdict(key, str(unit), why_meta, text, blob)
            record, why = (None, why) if why else read_record(text, blob, key, str(unit))
            if record is None:
                raise StoreError(self._damaged(key, str(unit), why))
            out.append((str(unit), record))
        return out

    def merge(self, other: str | Path | Store) -> int:
        """Copy every unit of `other` (another process's shard) into this store; returns how many were new
        (or replaced a damaged or unbound one). A unit present in both must hold the same bytes, else
        `StoreError`; a damaged unit of `other` is refused by name, and nothing is merged. An unbound unit of
        `other` (or every unit of a run whose metadata is unbound) is not copied, with a warning: its key cannot
        be verified, and copying it would vouch for it; a rerun computes it again."""
        src = other if isinstance(other, Store) else Store(other)
        try:
            runs = src.runs()
            with self._guarded(), self._transaction() as db:
                got = [self._merge_run(db, src, key, meta) for key, meta in runs]
        finally:
            if src is not other:
                src.close()
        passed, unbound = [n for _, p, _ in got for n in p], [n for _, _, u in got for n in u]
        if passed:
            warnings.warn(f"{src.path}: {len(passed)} damaged unit(s) were not merged; {self.path} holds them sound "
                          f"already: {', '.join(passed[:8])}", RewardLensWarning, stacklevel=2)
        if unbound:
            warnings.warn(f"{src.path}: {len(unbound)} unit(s) written before records were bound to their key were "
                          f"not merged (their key cannot be verified; a rerun computes them again): "
                          f"{', '.join(unbound[:8])}", RewardLensWarning, stacklevel=2)
        return sum(added for added, _, _ in got)

    def _merge_run(self, db: sqlite3.Connection, src: Store, key: RunKey, meta: dict[str, Any]
                   ) -> tuple[int, list[str], list[str]]:
        """One run of `src` into this store, inside the caller's transaction; returns the units new or replaced,
        and the damaged units passed over (this store holds them sound) and the unbound ones left out, named."""
        if not sound_key(key):
            raise StoreError(f"a run key in {src.path} is damaged ({key}); nothing was merged — run the audit "
                             "again with this store: the rank computes its pairs again into a sound run")
        found = src._find(key)
        assert found is not None  # listed by `src.runs()` a moment ago, in a shard no other process writes
        rows, why_meta = src._rows(found[0], None), read_meta(found[1], key)[1]
        if why_meta:  # unbound (`runs` refuses a damaged one): neither it nor its units are vouched for here
            return 0, [], [f"{key.instrument} unit {unit!r}" for unit, *_ in rows]
        run, repaired = self._run_id(db, key, meta)
        added, passed, unbound = 0, [], []
        for unit, pos, text, blob in rows:
            have = db.execute("SELECT record, arrays FROM units WHERE run_id=? AND unit=?", (run, unit)).fetchone()
            sound = have is not None and not repaired and not state(have[0], have[1], key, str(unit))
            why = state(text, blob, key, str(unit))
            if why == UNBOUND:  # copied, it would read as vouched for; this store may hold it sound already
                unbound += [] if sound else [f"{key.instrument} unit {unit!r}"]
            elif why and not sound:
                raise StoreError(f"{self._damaged(key, str(unit), why, src.path)}; nothing was merged")
            elif why:  # this store holds the unit sound already: the damaged copy would add nothing
                passed.append(f"{key.instrument} unit {unit!r}")
            elif sound and have != (text, blob):
                raise StoreError(f"unit {unit!r} of {key.instrument} differs between {src.path} and "
                                 f"{self.path}; the shards were not computed from the same model and data")
            elif have != (text, blob):
                self._put(db, key, run, (unit, pos, text, blob), replace=True)
                added += 1
        return added, passed, unbound
