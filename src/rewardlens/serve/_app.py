"""The HTTP face of the reward server (FastAPI): routes, request-size checks, answers and their counters.

`POST /get_reward` (OpenRLHF's remote RM), `POST /score` (native records or pairs), `GET /health`,
`GET /metrics` (Prometheus text), `GET /alarms` (JSON), `GET /` (the live dashboard) and
`GET /dashboard.json` (what it draws). See docs/serve.md.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations (`Request`) at run time.
import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data import chosen, rejected
from ..stats import json_number
from ._batcher import Batcher, Pending
from ._metrics import Metrics
from ._page import DASHBOARD
from ._protocol import Job, Limits, QueryAs, RequestError, native_job, openrlhf_job, parse_body

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ..monitor import PolicyMonitor

DISCONNECT_POLL = 0.25
"""How often (s) a waiting request checks that its caller is still there."""


@dataclass(frozen=True)
class Options:
    """How the app reads requests: `limits` on their size, `query_as` how an OpenRLHF query is read
    (`_protocol`), `pad` the pad token's text stripped from queries, `name` what `/health` calls the model."""

    limits: Limits = Limits()
    query_as: QueryAs = "text"
    pad: str | None = None
    name: str = "model"


def _finite(xs: list[float]) -> list[float | None]:
    return [json_number(x) for x in xs]


def create_app(batcher: Batcher, monitor: "PolicyMonitor | None" = None, options: Options = Options()) -> "FastAPI":
    """The ASGI app serving `batcher`'s model; it starts the worker on start-up and, on shutdown (after
    uvicorn has stopped accepting and answered what was in flight), scores what is queued, rolls the
    monitor's last batches and closes the log."""
    from fastapi import FastAPI

    @asynccontextmanager
    async def lifespan(_app: "FastAPI") -> AsyncIterator[None]:
        batcher.start()
        yield
        await asyncio.to_thread(batcher.stop)

    app = FastAPI(title="rewardlens reward server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.add_middleware(_Counted, metrics=batcher.metrics)
    _scoring_routes(app, batcher, monitor, options)
    _status_routes(app, batcher, monitor, options)
    return app


def _refuse(exc: RequestError) -> Any:
    from fastapi.responses import JSONResponse

    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)


async def _body(request: Any, limits: Limits) -> dict[str, Any]:
    """The request's JSON object, read no further than `limits.max_bytes` whatever its header says."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_bytes:
        raise RequestError(413, f"request body is {declared} bytes, over the server's --max-request-bytes "
                                f"{limits.max_bytes}; split the batch into smaller requests")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_bytes:
            raise RequestError(413, f"request body is over the server's --max-request-bytes {limits.max_bytes}; "
                                    "split the batch into smaller requests")
        chunks.append(chunk)
    return parse_body(b"".join(chunks), limits)


async def _scored(batcher: Batcher, request: Any, job: Job, endpoint: str) -> tuple[str, list[float]]:
    """Queue `job` and wait for its rewards; a caller that disconnects meanwhile has its request dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[float] | RequestError] = loop.create_future()

    def answer(result: list[float] | RequestError) -> None:
        loop.call_soon_threadsafe(lambda: None if future.done() else future.set_result(result))

    pending = Pending(job, uuid.uuid4().hex, endpoint, answer)
    batcher.submit(pending)
    while not future.done():
        await asyncio.wait([future], timeout=DISCONNECT_POLL)
        if not future.done() and await request.is_disconnected():
            pending.cancelled = True  # the worker drops it unscored if it has not taken it yet
            raise RequestError(499, "the caller closed the connection before its rewards were ready")
    result = future.result()
    if isinstance(result, RequestError):
        raise result
    return pending.id, result


def _scoring_routes(app: "FastAPI", batcher: Batcher, monitor: "PolicyMonitor | None", options: Options) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response

    @app.post("/get_reward")
    async def get_reward(request: Request) -> Response:
        try:
            job = openrlhf_job(await _body(request, options.limits), options.limits, options.pad, options.query_as)
            rid, rewards = await _scored(batcher, request, job, "/get_reward")
        except RequestError as exc:
            return _refuse(exc)
        values = _finite(rewards)
        alarms = 0 if monitor is None else sum(len(r.alarms) for r in list(monitor.records))
        return JSONResponse({"rewards": values, "scores": values,
                             "extra_logs": {"rewardlens_alarms": [alarms] * len(values)}, "id": rid})

    @app.post("/score")
    async def score(request: Request) -> Response:
        try:
            job = native_job(await _body(request, options.limits), options.limits)
            rid, rewards = await _scored(batcher, request, job, "/score")
        except RequestError as exc:
            return _refuse(exc)
        out: dict[str, Any] = {"id": rid, "rewards": _finite(rewards)}
        if job.pairs:
            arr = np.asarray(rewards, dtype=np.float64)
            out.update(chosen=_finite(chosen(arr).tolist()), rejected=_finite(rejected(arr).tolist()))
        return JSONResponse(out)


def _status_routes(app: "FastAPI", batcher: Batcher, monitor: "PolicyMonitor | None", options: Options) -> None:
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

    metrics = batcher.metrics

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok", "model": options.name, "queue": batcher.depth,
                             "in_flight": batcher.in_flight, "monitor": monitor is not None})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return PlainTextResponse(metrics.text(batcher.depth, batcher.in_flight),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def settled() -> dict[str, Any]:
        """`alarm_state` once every step already closed is recorded (off the event loop: the monitor's thread
        may be mid-record), with the backlog still recording if that took past the roller's timeout."""
        backlog = 0 if batcher.roller is None else await asyncio.to_thread(batcher.roller.settle)
        return {**alarm_state(monitor), "backlog": backlog}

    @app.get("/alarms")
    async def alarms() -> Response:
        return JSONResponse(await settled())

    @app.get("/dashboard.json")
    async def dashboard_data() -> Response:
        mean, sd = metrics.reward_stats()
        return JSONResponse({**await settled(), "reward_mean": json_number(mean), "reward_sd": json_number(sd),
                             "queue": batcher.depth, "sequences": metrics.sequences})

    @app.get("/")
    async def dashboard() -> Response:
        return HTMLResponse(DASHBOARD)


class _Counted:
    """ASGI middleware counting every answer by path and status, and timing it (a plain ASGI wrapper:
    Starlette's `BaseHTTPMiddleware` would hide a caller's disconnect from the route)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.request(str(scope.get("path", "")), status[0], time.perf_counter() - start)


def alarm_state(monitor: "PolicyMonitor | None") -> dict[str, Any]:
    """What `/alarms` answers: every record's step, mean reward and alarm count, and the alarms raised (all of
    them, in order, each with its plain-words message)."""
    if monitor is None:
        return {"monitor": False, "records": [], "alarms": []}
    records = list(monitor.records)
    return {"monitor": True,
            "records": [{"step": r.step, "n": int(len(r.rewards)), "reward": json_number(float(r.rewards.mean())),
                         "gain": json_number(r.gain), "alarms": len(r.alarms)} for r in records],
            "alarms": [{**a.to_dict(), "value": json_number(a.value), "ci": [json_number(c) for c in a.ci]}
                       for r in records for a in r.alarms]}
