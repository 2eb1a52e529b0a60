"""`rewardlens monitor-report`: the GRPO run's log as a page, checked in headless Chromium against the log."""

import html
import re
from pathlib import Path

from rewardlens.cli import main
from rewardlens.monitor import PolicyRun
from tests.helpers.browser import dom


def _dom(page: Path, profile: Path) -> str:
    return dom(page, profile)


def test_monitor_report_in_chromium(grpo_runs, tmp_path, capsys):
    log = grpo_runs["list"] / "monitor.jsonl"
    out = tmp_path / "policy.html"
    assert main(["monitor-report", str(log), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    run = PolicyRun.from_jsonl(log)
    assert all(a.message in printed for a in run.alarms)
    dom = _dom(out, tmp_path / "profile")
    for section in ("reward", "shares", "alarms"):
        assert f'id="{section}"' in dom
    series = re.findall(r'<polyline class="series" data-name="([^"]+)"[^>]*points="([^"]*)"', dom)
    names = [html.unescape(n) for n, _ in series]
    assert names == ["mean reward", *run.terms]
    # one point per batch on the reward curve, one per batch with a gain on each share curve
    assert len(series[0][1].split()) == len(run)
    assert len(series[1][1].split()) == sum(len(r.share) > 0 for r in run.records)
    alarms = run.alarms
    assert dom.count('class="alarm"') == len(alarms) + sum(a.kind == "direction" for a in alarms)
    for a in alarms:
        assert html.escape(a.message) in dom and f"<td>{a.step}</td>" in dom
    assert "<script" not in dom and "http" not in dom.replace("http://www.w3.org/2000/svg", "")
