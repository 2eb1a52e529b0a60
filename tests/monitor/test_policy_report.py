"""`rewardlens monitor-report`: the GRPO run's log as a page, checked in headless Chromium against the log."""

import html
import re
import subprocess
from pathlib import Path

import pytest

from rewardlens.cli import main
from rewardlens.monitor import PolicyRun

CHROMIUM = Path("/usr/bin/chromium")


def _dom(page: Path, profile: Path) -> str:
    if not CHROMIUM.exists():
        pytest.fail(f"headless Chromium is needed to render the page and {CHROMIUM} is missing; install it with "
                    "`bash scripts/setup.sh test` (Debian's chromium package)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", "--dump-dom"]
    done = subprocess.run([str(CHROMIUM), *flags, page.as_uri()], check=False, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


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
