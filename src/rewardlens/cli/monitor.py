"""`monitor-report`: a policy monitor's log (`rewardlens.monitor.monitored_reward(log=...)`) as an HTML page."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import Command, check_input, table


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", metavar="LOG", help="the JSON-lines log a policy monitor wrote (monitored_reward(log=...))")
    p.add_argument("--out", metavar="FILE", help="where to write the page (default: LOG with .html)")


def _check(args: argparse.Namespace) -> None:
    check_input(args.log, "LOG")


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
