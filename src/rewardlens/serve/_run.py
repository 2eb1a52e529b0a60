"""Put the pieces together around one loaded reward model and run them under uvicorn until SIGTERM/SIGINT.

A signal stops the listening socket at once (new connections are refused), lets every request in flight
finish (uvicorn waits for its connections), then the app's shutdown scores whatever is still queued, rolls
the monitor's last batches into records and closes the logs; the process then exits 0.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..model import RewardModel
from ..monitor import PolicyMonitor
from ._app import Options, create_app
from ._batcher import Batcher
from ._log import RequestLog, requests_path
from ._metrics import Metrics
from ._roll import Roller

if TYPE_CHECKING:
    from fastapi import FastAPI


@dataclass(frozen=True)
class Server:
    """A built server: the ASGI `app`, its `batcher` (the worker and queue) and the policy `monitor` (None
    when off)."""

    app: FastAPI
    batcher: Batcher
    monitor: PolicyMonitor | None


def sequence_limit(rm: RewardModel, budget: int) -> int:
    """The longest sequence accepted: the model's `max_length`, else its position table, never over `budget`."""
    if rm.max_length is not None:
        return min(rm.max_length, budget)
    positions = getattr(rm.model.config, "max_position_embeddings", None)
    return min(int(positions), budget) if isinstance(positions, int) and positions > 0 else budget


def build_server(rm: RewardModel, *, log: str | os.PathLike[str] | None = None, monitor: bool = True,
                 axes: Sequence[str] | None = None, directions: Any = None, roll_seconds: float = 60.0,
                 max_batch_tokens: int = 16384, queue: int = 256, batch_size: int = 64,
                 options: Options | None = None, progress: bool = True, **monitor_options: Any) -> Server:
    """The server for `rm`: the policy monitor (`PolicyMonitor` with `axes`/`directions`/`monitor_options`,
    its records appended to `log`), the request log beside it (`requests_path(log)`), the batcher and the app.
    The pad token's text (stripped from OpenRLHF queries) is the model's, unless `options` names one."""
    mon = None
    if monitor and rm.reads.multi:
        raise UsageError("the policy monitor splits a reward read at one position a sequence, and this reward model "
                         "reads several (a process RM's steps); serve it with monitor=False (--no-monitor)",
                         option="monitor")
    if monitor:
        mon = PolicyMonitor(rm, directions=directions, axes=axes, log=log, progress=progress, **monitor_options)
    metrics = Metrics()
    roller = None if mon is None else Roller(mon, roll_seconds, on_record=lambda r: metrics.record(len(r.alarms)))
    batcher = Batcher(rm, max_batch_tokens=max_batch_tokens, queue=queue, batch_size=batch_size,
                      max_tokens=sequence_limit(rm, max_batch_tokens),
                      log=None if log is None else RequestLog(requests_path(log)), roller=roller, metrics=metrics)
    opts = options or Options()
    if opts.pad is None:
        pad = getattr(rm.tokenizer, "pad_token", None)
        opts = Options(opts.limits, opts.query_as, pad if isinstance(pad, str) else None, opts.name)
    return Server(create_app(batcher, mon, opts), batcher, mon)


def run_server(server: Server, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "warning") -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully (module docstring) and return."""
    import uvicorn

    class _Graceful(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            # uvicorn raises the signal again once it has stopped; a graceful stop is this command's normal end.
            self._captured_signals.clear()

    config = uvicorn.Config(server.app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=None, lifespan="on")
    _Graceful(config).run()
