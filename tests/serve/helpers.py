"""A reward server on loopback for the tests: in a thread of the test process (`threaded`) or as the real
command in a subprocess (`command`), and a client written from the protocol alone (`post`: http.client)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

STARTUP = 180.0
"""The most seconds a server may take to answer /health (a bound on a hang, not a speed check)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def directions(d: int, seed: int = 0) -> dict[str, list[float]]:
    """Two fixed bias directions of width `d`: the monitor's maths without minutes of concept fitting."""
    rng = np.random.default_rng(seed)
    return {"first": rng.normal(size=d).tolist(), "second": rng.normal(size=d).tolist()}


def post(port: int, path: str, body: Any, *, raw: bytes | None = None, timeout: float = 120.0,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, parsed JSON or text) of one POST (`raw`: exactly these bytes as the body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        answer = conn.getresponse()
        text = answer.read().decode()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return answer.status, dict(answer.getheaders()), parsed
    finally:
        conn.close()


def get(port: int, path: str, timeout: float = 30.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def wait_healthy(port: int, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + STARTUP
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited {proc.returncode} before answering: {proc.stderr.read()}")
        with contextlib.suppress(OSError):
            if get(port, "/health", timeout=2)[0] == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"no /health answer within {STARTUP} s")


def wait_for(condition, what: str, limit: float = 60.0) -> None:
    """Poll `condition` until it holds (a bound on a hang, never a speed assertion)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {limit} s")
        time.sleep(0.02)


@contextlib.contextmanager
def threaded(rm, tmp: Path, **options: Any) -> Iterator[tuple[int, Any]]:
    """`build_server(rm, ...)` under uvicorn in a thread: yields (port, Server); stops it gracefully."""
    import uvicorn

    from rewardlens.serve import build_server

    options.setdefault("directions", directions(rm.d_model))
    server = build_server(rm, log=tmp / "policy.jsonl", progress=False, **options)
    port = free_port()
    runner = uvicorn.Server(uvicorn.Config(server.app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        wait_healthy(port)
        yield port, server
    finally:
        server.batcher.release()
        runner.should_exit = True
        thread.join(60)


def command(model: Path, tmp: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """`rewardlens serve MODEL` as a subprocess with fixed directions (no concept fitting) and its log under `tmp`;
    returns once it answers /health."""
    import rewardlens as rl

    width = rl.load(model).d_model
    (tmp / "directions.json").write_text(json.dumps(directions(width)))
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    watch = [] if "--no-monitor" in args else ["--directions", str(tmp / "directions.json")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rewardlens", "serve", str(model), "--port", str(port), "--log",
         str(tmp / "policy.jsonl"), *watch, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_healthy(port, proc)
    return proc, port
