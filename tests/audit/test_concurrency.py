"""Many processes on one store or one output folder: a new store opened by 8 processes at once
never fails, a lock is never called corruption, and a second run into a folder refuses naming the
first until the first is gone (even SIGKILLed)."""

import json
import multiprocessing
import os
import sqlite3
import subprocess
import threading
import time

import numpy as np
import pytest

from rewardlens.audit import Plan, Store, audit
from rewardlens.audit._lock import LOCK_NAME
from rewardlens.audit.internal import RunKey, run_lock
from rewardlens.errors import RunLockedError, StoreError, StoreLockedError
from tests.helpers.locks import held_by_another_process

KEY = RunKey("model-a", "data-1", "lens", "1")
PROCESSES, ROUNDS = 8, 40


def _open_new_stores(paths, barrier, results):
    """One of the racing processes: per round, wait for all the others, then open and write."""
    for path in paths:
        barrier.wait(timeout=120)
        try:
            store = Store(path)
            store.write([(KEY, str(os.getpid()), 0, {"pid": os.getpid()})])
            store.close()
            results.put((str(path), None))
        except Exception as exc:  # noqa: BLE001 - every failure is the finding
            results.put((str(path), f"{type(exc).__name__}: {exc}"))


def test_eight_processes_open_and_write_a_new_store_at_once(tmp_path):
    """Before the fix about 1 open in 300 failed with "not a results store (database is locked)"."""
    ctx = multiprocessing.get_context("fork")  # the workers only run SQLite: no torch threads to inherit
    paths = [tmp_path / f"round{r}.sqlite" for r in range(ROUNDS)]
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_open_new_stores, args=(paths, barrier, results)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=300) for _ in range(PROCESSES * ROUNDS)]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    failures = [o for o in outcomes if o[1] is not None]
    assert failures == [], f"{len(failures)} of {len(outcomes)} opens failed: {failures[:3]}"
    assert all(p.exitcode == 0 for p in procs)
    for path in paths:  # every process's row is there
        assert len(Store(path).done(KEY)) == PROCESSES


def test_a_file_that_is_not_sqlite_is_named_and_left_untouched(tmp_path):
    path = tmp_path / "results.sqlite"
    junk = np.random.default_rng(0).bytes(16384)
    path.write_bytes(junk)
    with pytest.raises(StoreError, match="is not a rewardlens results store") as info:
        Store(path)
    message = str(info.value)
    assert str(path) in message and "left untouched" in message and "new file" in message
    assert "delete" not in message.lower() and "locked" not in message
    assert not isinstance(info.value, StoreLockedError)
    assert path.read_bytes() == junk


def test_a_lock_held_past_the_timeout_names_another_process_not_a_broken_file(tmp_path):
    path = tmp_path / "results.sqlite"
    other = sqlite3.connect(path, isolation_level=None)  # another process creating the store, mid-transaction
    other.execute("BEGIN EXCLUSIVE")
    other.execute("CREATE TABLE runs (x)")
    start = time.monotonic()
    with pytest.raises(StoreLockedError, match="another process is writing it") as info:
        Store(path, timeout=0.3)
    assert time.monotonic() - start < 10  # bounded by the timeout, not SQLite's default wait
    assert str(path) in str(info.value) and "not a rewardlens" not in str(info.value)
    assert "delete" not in str(info.value).lower()
    other.execute("ROLLBACK")
    other.close()

    store = Store(path, timeout=0.3)  # a write waiting on another writer past the timeout says the same
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreLockedError, match="another process"):
        store.write([(KEY, "0", 0, {"v": 0})])
    writer.execute("ROLLBACK")
    store.write([(KEY, "0", 0, {"v": 0})])  # the lock gone, the store is as good as before
    assert store.done(KEY) == {"0"}


def test_a_second_run_refuses_naming_the_first_and_takes_over_once_it_is_killed(tiny_root, pairs, tmp_path):
    import rewardlens as rl

    out = tmp_path / "out"
    with held_by_another_process(out) as (first, started):
        with pytest.raises(RunLockedError, match=f"pid {first.pid} on ") as info:
            with run_lock(out):
                pass
        assert started in str(info.value) and str(out) in str(info.value)
        model = rl.load(str(tiny_root["gpt2"]))
        plan = Plan(chunk_size=1, probes=False, concepts=False)
        with pytest.raises(RunLockedError, match=f"pid {first.pid}"):  # audit() takes the store folder's lock
            audit(model, pairs, store=out / "results.sqlite", plan=plan)
        assert not (out / "results.sqlite").exists()  # refused before it touched the store
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == first.pid  # the killed run's leftover
    with run_lock(out) as lock:
        assert lock.stale is not None and lock.stale.pid == first.pid and lock.holder.pid == os.getpid()
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
        res = audit(model, pairs, store=out / "results.sqlite", plan=plan)  # the same thread nests
    assert len(res.pair_ids) == len(pairs)
    assert not (out / LOCK_NAME).exists()


def test_a_run_can_wait_for_the_one_before_it(tmp_path):
    held, release = threading.Event(), threading.Event()

    def first():
        with run_lock(tmp_path):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=first)
    thread.start()
    assert held.wait(30)
    with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):  # another thread counts as another run
        with run_lock(tmp_path):
            pass
    threading.Timer(0.3, release.set).start()
    with run_lock(tmp_path, wait=30) as lock:
        assert lock.stale is None and lock.holder.pid == os.getpid()
    thread.join(30)


def test_without_flock_the_pid_in_the_lock_file_decides(tmp_path, monkeypatch):
    import errno
    import socket

    from rewardlens.audit import _lock

    def no_flock(fd):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(_lock, "_flock", no_flock)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid, alive in ((os.getppid(), True), (dead.pid, False)):
        holder = {"pid": pid, "host": socket.gethostname(), "started": "2025-01-01T00:00:00+00:00"}
        (tmp_path / LOCK_NAME).write_text(json.dumps(holder))
        if alive:
            with pytest.raises(RunLockedError, match=f"pid {pid} on"):
                with run_lock(tmp_path):
                    pass
        else:
            with run_lock(tmp_path) as lock:
                assert lock.stale is not None and lock.stale.pid == pid
