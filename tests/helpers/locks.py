"""Another process holding an output folder's run lock, for the tests of refusal and takeover."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOLDER = """
import sys, time
from rewardlens.audit.internal import run_lock
with run_lock(sys.argv[1]) as lock:
    print(lock.holder.started, flush=True)
    time.sleep(600)
"""


@contextmanager
def held_by_another_process(out: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process that takes `out`'s run lock and holds it; yields (the process, its start
    time as written in the lock) and SIGKILLs it on exit, leaving its lock file behind as a crash would."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    try:
        started = child.stdout.readline().strip()
        assert started, child.stderr.read()[-2000:]
        yield child, started
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
