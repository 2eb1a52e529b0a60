"""The results store's schema, and SQLite's errors told apart, each said in the store's words (the guarantees:
audit/_store.py).

A file holding both tables (`COLUMNS`) is a results store; one holding neither is new; one holding another
program's tables is left untouched; one holding a single table of the two lost the other, and is damaged
(`schema`: both are created in one transaction).

A busy or locked database is a transient state, never a broken file (`is_lock`, `locked`). Of the rest
(`unreadable`): "not a database" is a file that is no results store, left untouched; a page SQLite cannot
parse ("malformed") is the one case where the file itself is damaged; an index that disagrees with its
table is damaged too, and `REINDEX` mends it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ..errors import StoreError, StoreLockedError


def is_lock(exc: BaseException) -> bool:
    """True for SQLite's busy/locked errors: another connection holds a lock, the file is fine."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    name = getattr(exc, "sqlite_errorname", "")
    text = str(exc).lower()
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text or "busy" in text


def _is_corrupt(exc: sqlite3.Error) -> bool:
    """True for SQLite's own "this file is damaged": a page it cannot parse."""
    name = getattr(exc, "sqlite_errorname", "")
    return name.startswith("SQLITE_CORRUPT") or "malformed" in str(exc).lower()


def locked(path: Path, timeout: float) -> StoreLockedError:
    """The store's error for a lock another process held past `timeout` seconds."""
    return StoreLockedError(
        f"{path} is locked: another process is writing it and held its lock for more than the "
        f"{timeout:g} s timeout. The store is not damaged; wait for the other run to finish "
        "(or give a longer timeout) and run again")


def unreadable(path: Path, exc: sqlite3.Error | UnicodeDecodeError) -> StoreError:
    """The store's error for an SQLite error that is no lock, in one line (SQLite may quote a schema's SQL)."""
    if isinstance(exc, UnicodeDecodeError):
        exc = sqlite3.DatabaseError(f"database disk image is malformed (its schema is not text: {exc})")
    said = " ".join(str(exc).split())
    if "not a database" in said:
        return StoreError(f"{path} is not a rewardlens results store (SQLite: {said}); the file was "
                          "left untouched — point --store at a new file")
    if _is_corrupt(exc):  # the one case where the file itself, not a unit, cannot be read
        return StoreError(f"{path} is damaged: SQLite cannot read its pages (SQLite: {said}); it was left as "
                          "it is — point --store at a new file, or restore this one from a copy")
    if isinstance(exc, sqlite3.IntegrityError):  # a row the store looked for, not found, yet indexed
        return StoreError(f"{path} is damaged: its index disagrees with its table (SQLite: {said}); it was "
                          f"left as it is — rebuild the index with `sqlite3 {path} REINDEX` and run again, "
                          "or point --store at a new file")
    return StoreError(f"{path} cannot be read as a results store (SQLite: {said}); the file was "
                      "left untouched — check the path and its permissions, or point --store at a new file")


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


def schema(db: sqlite3.Connection, path: Path) -> bool:
    """Whether the file already holds both tables (False: neither, a new file); `StoreError` when it holds
    another program's tables, or one of ours without the other (a store that lost a table)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    foreign = sorted(t for t in tables if t not in COLUMNS and not t.startswith("sqlite_"))
    wrong = [t for t in COLUMNS if t in tables
             and tuple(r[1] for r in db.execute(f"PRAGMA table_info({t})")) != COLUMNS[t]]
    if wrong or (foreign and not set(COLUMNS) <= tables):
        found = ", ".join(wrong + foreign)
        damaged = "" if foreign else ", or a results store whose schema is damaged"
        raise StoreError(f"{path} is not a rewardlens results store (it holds another program's "
                         f"tables: {found}){damaged}; the file was left untouched — point --store at a new file")
    gone = [t for t in COLUMNS if t not in tables]
    if len(gone) == 1:  # both are created in one transaction: one alone is a store that lost the other
        lost = "its units cannot be matched to their runs" if gone[0] == "runs" else "its results are gone"
        raise StoreError(f"{path} is damaged: its table {gone[0]!r} is missing, so {lost}; it was left as "
                         "it is — move it aside (or restore it from a copy) and run again, or point --store at "
                         "a new file")
    return not gone
