"""`monitor-report`'s paths: a page path that is a folder or cannot be written, and a LOG that is a folder,
are one line naming the path (before, a raw `[Errno 21] Is a directory` or `[Errno 2]`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rewardlens.cli import main


@pytest.fixture
def log(tmp_path) -> Path:
    """A one-record policy monitor log, as monitored_reward(log=...) writes it."""
    from rewardlens.monitor import PolicyRecord

    rec = PolicyRecord(0, np.array([0.5]), ("length",), np.array([[0.1]]), np.array([0.2]), np.array([0.2]),
                       ("length",), np.array([[3.0]]))
    path = tmp_path / "policy.jsonl"
    path.write_text(rec.to_json() + "\n")
    return path


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rewardlens: error: "), err
    return err[0].removeprefix("rewardlens: error: ")


def test_a_page_path_that_is_a_folder_is_named(log, tmp_path, capsys):
    (tmp_path / "pages").mkdir()
    assert main(["monitor-report", str(log), "--out", str(tmp_path / "pages")]) == 2
    assert _one_line(capsys) == f"--out page is a folder, not a file: {tmp_path / 'pages'}"


def test_the_default_page_path_that_is_a_folder_is_named(log, capsys):
    log.with_suffix(".html").mkdir()
    assert main(["monitor-report", str(log)]) == 2
    assert _one_line(capsys) == (f"page (LOG with .html; choose another with --out) is a folder, not a file: "
                                 f"{log.with_suffix('.html')}")


def test_a_page_where_no_file_can_be_made_is_named(log, capsys):
    assert main(["monitor-report", str(log), "--out", "/proc/x.html"]) == 2
    assert _one_line(capsys).startswith("cannot write to --out page: /proc/x.html (/proc takes no new files")


def test_a_log_that_is_a_folder_is_named(tmp_path, capsys):
    assert main(["monitor-report", str(tmp_path)]) == 2
    assert _one_line(capsys).startswith(f"LOG is a folder, not a file: {tmp_path}; pass the JSON-lines file")

