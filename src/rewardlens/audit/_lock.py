"""The run lock: one audit at a time per output folder.

Two audits writing into one folder would interleave their report files and race on the store
(both compute a chunk; the second write is refused as a duplicate). `run_lock(out)` holds
`<out>/.rewardlens.lock` for the length of a run, and a second run refuses (or waits, `wait=`)
with a message naming the holder: its pid, host and start time, kept as JSON in the lock file.

The lock itself is `fcntl.flock` on that file, not the file's existence: the kernel drops a flock
when its holder dies, however it dies (SIGKILL, the OOM killer, a preempted node), so a killed run
never leaves a lock behind that blocks the next one. A lock file whose JSON names a run that is
gone (the run was killed before it could remove it) is recognised as stale and taken over; the new
holder says so in `RunLock.stale`. On file systems without flock (some network or FUSE mounts) the
JSON is the lock, and its pid is checked for life instead.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from ..errors import RunLockedError

LOCK_NAME = ".rewardlens.lock"
"""The lock file's name inside the output folder."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run lock: what a refusal names."""

    pid: int
    host: str
    started: str
    """Local start time, ISO 8601 with the UTC offset."""

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started}"


@dataclass(frozen=True)
class RunLock:
    """A held run lock."""

    path: Path
    """The lock file."""
    holder: Holder
    """This run."""
    stale: Holder | None
    """A killed run whose leftover lock this run took over, or None."""


# Locks this process holds, by lock file, with the thread holding each: a run that takes the lock
# again in the same thread (the CLI around `audit`) nests instead of refusing itself. Keyed with the
# pid, so a forked child does not inherit its parent's entries.
_HELD: dict[tuple[int, Path], tuple[int, RunLock]] = {}
_GUARD = threading.Lock()


@contextmanager
def run_lock(out: str | Path, *, wait: float = 0.0, fix: str = "give this run another --out") -> Iterator[RunLock]:
    """Hold the run lock of the folder `out` (created if missing) for the `with` block.

    Another process (or thread) holding it: wait up to `wait` seconds for it, then raise
    `RunLockedError` naming the holder's pid, host and start time, and `fix` (what else than waiting
    frees this run: the option that put it in `out`, e.g. a shared store's `--store`). The same thread
    taking the lock it already holds nests. The lock file is removed when the outermost block exits.
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder.resolve() / LOCK_NAME
    key = (os.getpid(), path)
    with _GUARD:
        held = _HELD.get(key)
    if held is not None and held[0] == threading.get_ident():
        yield held[1]  # the outer block releases it
        return
    fd, stale = _acquire(path, wait, fix)
    me = Holder(os.getpid(), socket.gethostname(), datetime.now().astimezone().isoformat(timespec="seconds"))
    lock = RunLock(path, me, stale)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(me)).encode(), 0)
        with _GUARD:
            _HELD[key] = (threading.get_ident(), lock)
        yield lock
    finally:
        with _GUARD:
            _HELD.pop(key, None)
        # Unlink while still holding the lock, then let go: a run waiting on this inode finds it
        # unlinked when it gets the lock and starts over on a fresh file (see `_try`).
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)


def _acquire(path: Path, wait: float, fix: str) -> tuple[int, Holder | None]:
    """Take the lock, polling up to `wait` seconds; returns the descriptor and a stale holder."""
    deadline = time.monotonic() + wait
    while True:
        got = _try(path)
        if got is not None:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            holder = _read(path)
            who = str(holder) if holder is not None else "a process that has not yet recorded its pid"
            waited = f" (waited {wait:g} s)" if wait > 0 else ""
            raise RunLockedError(
                f"another run is writing into {path.parent}: {who}{waited}. Wait for it to finish, or "
                f"{fix}. The lock ({path}) is released when that process exits, even if it is killed")
        time.sleep(min(left, 0.1))


def _try(path: Path) -> tuple[int, Holder | None] | None:
    """One attempt: the descriptor and any stale holder once the lock is ours, None while held."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _flock(fd)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as exc:  # no flock on this file system: the JSON's pid is the lock
            previous = _read(path)
            if exc.errno not in _NO_FLOCK or (previous is not None and _alive(previous)):
                os.close(fd)
                if exc.errno not in _NO_FLOCK:
                    raise
                return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # the file still on disk, not one its last holder unlinked while we waited for it
            return fd, _read(path)
        os.close(fd)


_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def _flock(fd: int) -> None:
    """An exclusive flock without blocking; `BlockingIOError` while another holds it."""
    try:
        import fcntl
    except ImportError as exc:  # Windows has no flock
        raise OSError(errno.ENOSYS, "no flock on this platform") from exc
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _read(path: Path) -> Holder | None:
    """The holder a lock file names; None when it is empty, missing or half written."""
    try:
        return Holder(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def _alive(holder: Holder) -> bool:
    """Whether the holder's process still runs; a holder on another host is assumed alive."""
    if holder.host != socket.gethostname():
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


__all__ = ["LOCK_NAME", "Holder", "RunLock", "run_lock"]
