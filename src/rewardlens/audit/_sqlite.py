"""SQLite's errors told apart, each said in the results store's words (the guarantees: audit/_store.py).

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
