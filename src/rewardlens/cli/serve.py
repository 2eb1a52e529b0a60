"""`serve`: the reward model over HTTP (OpenRLHF's remote-RM protocol and a native one), with the policy
monitor on the traffic (docs/serve.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._common import ArgumentError, Command, add_model_options, check_input, check_out_file, load_model, positive


def _arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.set_defaults(batch_size=64)  # rows per forward: a server's batches are wider than a one-off score's
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch-tokens", type=positive(int), default=16384,
                   help="token budget of one batched forward: queued requests are scored together up to it")
    p.add_argument("--queue", type=positive(int), default=256,
                   help="requests that may wait for the model; beyond it the server answers 503 with Retry-After")
    p.add_argument("--max-request-bytes", type=positive(int), default=8 << 20, help="largest request body (413 above)")
    p.add_argument("--max-request-items", type=positive(int), default=4096,
                   help="most sequences in one request (413 above)")
    p.add_argument("--query", choices=["text", "chat"], default="text", dest="query_as",
                   help="OpenRLHF queries: score the full text as sent (default), or rebuild [user: prompt, "
                        "assistant: response] so the reward model's chat template applies")
    p.add_argument("--log", metavar="FILE", default=None,
                   help="the policy monitor's JSON-lines log (rewardlens monitor-report FILE); every answered "
                        "request also goes to FILE's .requests.jsonl, synced before the answer")
    p.add_argument("--no-monitor", action="store_true", help="score only: no policy monitor on the traffic")
    p.add_argument("--axes", default=None,
                   help="comma-separated probe axes whose concept directions the monitor watches (default: the five "
                        "the surface statistics observe)")
    p.add_argument("--directions", metavar="FILE", default=None,
                   help="JSON {name: [floats]}: bias directions in the head's input space, watched instead of the "
                        "probe axes' concept directions (none computed at start-up)")
    p.add_argument("--parts-every", type=int, default=10,
                   help="exact sublayer attribution on every N-th monitor record (0: never)")
    p.add_argument("--roll-seconds", type=positive(float), default=60.0,
                   help="callers that send no step are monitored in windows of this many seconds")
    p.add_argument("--threads", type=positive(int), default=None,
                   help="CPU threads torch may use for the forward (default: torch's own choice); on a CPU server "
                        "leave one core to the HTTP side")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="warning",
                   help="uvicorn's log level (stderr)")


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.port <= 65535:
        raise ArgumentError(f"--port must be 1 to 65535, got {args.port}")
    if args.log is not None:
        check_out_file(args.log, "--log file")
    if args.directions is not None:
        check_input(args.directions, "--directions")
    chosen = [f for f in ("axes", "directions") if getattr(args, f) is not None]
    if args.no_monitor and chosen:
        raise ArgumentError(f"--{chosen[0]} chooses what the monitor watches, and --no-monitor turns it off; drop one")
    if len(chosen) == 2:
        raise ArgumentError("--axes and --directions both choose the monitor's directions; pass one")
    if args.parts_every < 0:
        raise ArgumentError(f"--parts-every must be >= 0 (0: never), got {args.parts_every}")


def _serve(args: argparse.Namespace) -> dict[str, Any]:
    from ..serve import Limits, Options, build_server, read_requests, requests_path, run_server

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    rm = load_model(args)
    axes = None if args.axes is None else [a.strip() for a in args.axes.split(",") if a.strip()]
    directions = None if args.directions is None else _directions(args.directions)
    options = Options(Limits(args.max_request_bytes, args.max_request_items), args.query_as, None, args.model)
    server = build_server(rm, log=args.log, monitor=not args.no_monitor, axes=axes, directions=directions,
                          parts_every=args.parts_every, roll_seconds=args.roll_seconds,
                          max_batch_tokens=args.max_batch_tokens, queue=args.queue, batch_size=args.batch_size,
                          options=options)
    where = f"http://{args.host}:{args.port}"
    print(f"rewardlens serve: listening on {where} (POST /get_reward, POST /score; dashboard {where}/; monitor "
          f"{'off' if server.monitor is None else 'on'}{'' if args.log is None else '; log ' + args.log})",
          file=sys.stderr, flush=True)
    run_server(server, args.host, args.port, log_level=args.log_level)
    logged = requests_path(args.log) if args.log is not None else None
    return {"requests": len(read_requests(logged)) if logged is not None and logged.exists() else None,
            "sequences": server.batcher.metrics.sequences,
            "records": None if server.monitor is None else len(server.monitor.records),
            "alarms": [] if server.monitor is None else [a.message for a in server.monitor.run.alarms]
            if server.monitor.records else [], "log": args.log}


def _directions(path: str) -> dict[str, list[float]]:
    """The --directions file: a JSON object of name → list of numbers (the width is checked against the model
    when the monitor is built)."""
    import json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ArgumentError(f"--directions {path} is not JSON ({exc}); write {{\"name\": [floats]}}") from None
    if not isinstance(data, dict) or not data or not all(
            isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v) for v in data.values()):
        raise ArgumentError(f"--directions {path} must be a non-empty JSON object of name → list of numbers")
    return {str(k): [float(x) for x in v] for k, v in data.items()}


def _show(result: dict[str, Any]) -> None:
    print(f"rewardlens serve: stopped after {result['sequences']} sequences"
          + (f", {result['records']} monitor records" if result["records"] is not None else "")
          + (f"; log {result['log']}" if result["log"] else ""))
    for message in result["alarms"]:
        print(f"alarm: {message}")


COMMANDS = [Command("serve", "serve the reward model over HTTP (OpenRLHF's POST /get_reward and a native /score), "
                    "batching concurrent requests and monitoring the policy's samples", _arguments, _serve, _show,
                    check=_check)]
