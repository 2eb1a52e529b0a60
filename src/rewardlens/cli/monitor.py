"""`monitor-report`: a policy monitor's log (`rewardlens.monitor.monitored_reward(log=...)`) as an HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import ArgumentError, Command, check_input, check_out_file, table


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", metavar="LOG", help="the JSON-lines log a policy monitor wrote (monitored_reward(log=...))")
    p.add_argument("--out", metavar="FILE", help="where to write the page (default: LOG with .html)")


def _check(args: argparse.Namespace) -> None:
    """LOG a readable file; the page (--out, else LOG with .html) a file that can be written, its missing
    folders created as the audit creates its own."""
    check_input(args.log, "LOG")
    if Path(args.log).expanduser().is_dir():
        raise ArgumentError(f"LOG is a folder, not a file: {args.log}; pass the JSON-lines file a policy monitor "
                            "wrote (monitored_reward(log=...))")
    if args.out is not None:
        check_out_file(args.out, "--out page")
    else:
        check_out_file(str(Path(args.log).with_suffix(".html")), "page (LOG with .html; choose another with --out)")


def _report(args: argparse.Namespace) -> dict[str, Any]:
    from ..monitor import PolicyRun, monitor_report

    out = monitor_report(args.log, args.out)
    run = PolicyRun.from_jsonl(args.log)
    finite = lambda x: float(x) if x == x else None  # noqa: E731  (NaN is not JSON)
    last = run.records[-1]
    return {"page": str(out), "batches": len(run), "steps": [int(run.steps[0]), int(run.steps[-1])],
            "reward": [finite(float(r.rewards.mean())) for r in run.records], "gain": finite(last.gain),
            "alarms": [{"step": a.step, "kind": a.kind, "name": a.name, "axis": a.axis, "message": a.message}
                       for a in run.alarms]}


def _show(result: dict[str, Any]) -> None:
    print(f"{result['batches']} batches, steps {result['steps'][0]}-{result['steps'][1]}; page: {result['page']}")
    rows = [[a["step"], a["kind"], a["message"]] for a in result["alarms"]]
    print(table(["step", "kind", "alarm"], rows) if rows else "no alarm")


COMMANDS = [Command("monitor-report", "draw a policy monitor's log (reward, bias directions' shares of the gain, "
                    "alarms) as a self-contained HTML page", _arguments, _report, _show, check=_check)]
