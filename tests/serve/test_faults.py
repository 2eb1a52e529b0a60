"""The real command (`rewardlens serve` in a subprocess) under load, then stopped: by SIGTERM (exits 0, every
acknowledged request in the log, the monitor's last steps rolled into records) and by SIGKILL (nothing
acknowledged lost)."""

from __future__ import annotations

import http.client
import signal
import subprocess
import sys
import threading

import pytest

from rewardlens.monitor import PolicyRun
from rewardlens.serve import read_requests, requests_path
from tests.serve.helpers import command, post, wait_for

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

CLIENTS = 8


def _load(port: int, samples, stop: threading.Event) -> tuple[list[tuple[str, list[float]]], list[int]]:
    """CLIENTS threads posting until `stop` or until the server is gone: (acknowledged (id, rewards), statuses
    of the answers that were not 200)."""
    acked: list[tuple[str, list[float]]] = []
    other: list[int] = []

    def client(k: int) -> None:
        n = 0
        while not stop.is_set():
            p, r = samples[(k * 7 + n) % len(samples)]
            try:
                status, _, body = post(port, "/score", {"records": [{"prompt": p, "response": r}], "step": n // 3},
                                       timeout=60)
            except (OSError, http.client.HTTPException):
                return  # refused or cut: the server has stopped listening
            (acked.append((body["id"], body["rewards"])) if status == 200 else other.append(status))
            n += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    _load.threads = threads  # type: ignore[attr-defined]
    return acked, other


def _join() -> None:
    for t in _load.threads:  # type: ignore[attr-defined]
        t.join(120)


def test_sigterm_under_load_finishes_in_flight_work_flushes_the_logs_and_exits_0(demo_dir, samples, tmp_path):
    proc, port = command(demo_dir, tmp_path)
    stop = threading.Event()
    acked, other = _load(port, samples, stop)
    wait_for(lambda: len(acked) >= 40, "40 acknowledged requests", limit=300)
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=120)
    finally:
        stop.set()
        _join()
    assert rc == 0, proc.stderr.read()
    assert set(other) <= {503}, other  # refused while stopping, never failed
    logged = {e.id: e for e in read_requests(requests_path(tmp_path / "policy.jsonl"))}
    assert all(logged[i].rewards == tuple(r) for i, r in acked)
    run = PolicyRun.from_jsonl(tmp_path / "policy.jsonl")
    # every logged sample reached the monitor: the steps still gathering were rolled at shutdown
    assert sum(len(r.rewards) for r in run.records) == sum(len(e.rewards) for e in logged.values())
    assert {r.step for r in run.records} == {e.step for e in logged.values()}


def test_sigkill_under_load_loses_nothing_acknowledged(demo_dir, samples, tmp_path):
    proc, port = command(demo_dir, tmp_path, "--no-monitor")
    stop = threading.Event()
    acked, _ = _load(port, samples, stop)
    wait_for(lambda: len(acked) >= 40, "40 acknowledged requests", limit=300)
    proc.kill()
    proc.wait(timeout=60)
    stop.set()
    _join()
    seen = list(acked)
    logged = {e.id: e.rewards for e in read_requests(requests_path(tmp_path / "policy.jsonl"))}
    missing = [i for i, _ in seen if i not in logged]
    assert not missing, f"{len(missing)} acknowledged requests are not in the log"
    assert all(logged[i] == tuple(r) for i, r in seen)


def test_the_command_refuses_bad_options_in_one_line(demo_dir, tmp_path):
    for args, words in [(["--port", "0"], "--port must be 1 to 65535"),
                        (["--no-monitor", "--axes", "length"], "--no-monitor"),
                        (["--directions", str(tmp_path / "none.json")], "--directions")]:
        proc = subprocess.run([sys.executable, "-m", "rewardlens", "serve", str(demo_dir), *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
