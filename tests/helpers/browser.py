"""Headless Chromium for the page tests: one way to run it, with the flags that keep it offline."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
OFFLINE = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
"""No network, no first-run or update traffic, no sandbox (tests run as root in a container)."""


def chromium(args: list[str], page: Path | str, profile: Path, *, what: str = "the page",
             budget_ms: int = 10_000) -> subprocess.CompletedProcess:
    """Run headless Chromium on `page` (a path, or a file URI with a hash) with `args` (`--dump-dom`,
    `--screenshot=...`, `--window-size=...`) after `budget_ms` of virtual time for its scripts."""
    if not CHROMIUM.exists():
        pytest.fail(f"headless Chromium is needed to render {what} and {CHROMIUM} is missing; install it with "
                    "`bash scripts/setup.sh test` (Debian's chromium package)")
    uri = page.as_uri() if isinstance(page, Path) else page
    flags = [*OFFLINE, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}"]
    done = subprocess.run([str(CHROMIUM), *flags, *args, uri], check=False, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def dom(page: Path | str, profile: Path, *, what: str = "the page", budget_ms: int = 10_000) -> str:
    """The DOM of `page` after its scripts ran."""
    return chromium(["--dump-dom"], page, profile, what=what, budget_ms=budget_ms).stdout
