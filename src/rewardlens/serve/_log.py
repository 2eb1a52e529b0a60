"""The server's request log: one JSON line per answered request, appended, flushed and fsynced before any of
the batch's callers gets an answer, so a SIGKILL loses nothing acknowledged.

The log sits next to the policy monitor's (`--log run/policy.jsonl` → `run/policy.requests.jsonl`); the
monitor's own records (rewards, shares of the gain, alarms, one per rolled step) go to the `--log` file
itself, which `rewardlens monitor-report` reads.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError


def requests_path(log: str | os.PathLike[str]) -> Path:
    """Where the request log of the monitor log `log` lives: `x.jsonl` → `x.requests.jsonl`."""
    path = Path(log)
    return path.with_name(path.stem + ".requests.jsonl")


@dataclass(frozen=True)
class Logged:
    """One answered request: its `id`, the caller's `step` (None when it sent none), the server's clock
    `time` (s since the epoch), the `endpoint` and the `rewards` it was given (None where not finite)."""

    id: str
    step: int | None
    time: float
    endpoint: str
    rewards: tuple[float | None, ...]

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "step": self.step, "time": self.time, "endpoint": self.endpoint,
                           "rewards": list(self.rewards)})


class RequestLog:
    """Append-only JSON lines at `path`, written a batch at a time (one fsync per batch, not per request)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (held open: closed by close())
        self._lock = threading.Lock()

    def append(self, entries: Sequence[Logged]) -> None:
        """Write `entries` and return only once they are on disk."""
        if not entries:
            return
        with self._lock:
            self._file.write("".join(e.to_json() + "\n" for e in entries))
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()


def read_requests(path: str | os.PathLike[str]) -> list[Logged]:
    """Every request a server's log holds; a last line cut short by a kill is skipped."""
    lines = [x for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            d: dict[str, Any] = json.loads(line)
            out.append(Logged(str(d["id"]), d["step"], float(d["time"]), str(d["endpoint"]), tuple(d["rewards"])))
        except (ValueError, KeyError, TypeError) as exc:
            if i < len(lines) - 1:
                raise DataError(f"{path}: line {i + 1} is not a request record ({exc}); only the last line may be cut "
                                "short by a kill — was it written by rewardlens serve?") from None
    return out
