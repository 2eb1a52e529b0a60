"""`built_once`, the one way a cached folder is built (organisms, real models, the loop's policies)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rewardlens.zoo.organisms.internal import READY, built_once


def test_builds_once_across_threads_and_never_shows_half_a_folder(tmp_path):
    calls: list[int] = []
    seen: list[bool] = []
    final = tmp_path / "thing"

    def make(work: Path) -> None:
        calls.append(1)
        (work / "a.txt").write_text("a")
        time.sleep(0.2)  # the other thread waits on the lock meanwhile
        seen.append(final.exists())
        (work / "b.txt").write_text("b")

    out: list[Path] = []
    threads = [threading.Thread(target=lambda: out.append(built_once(final, make))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [final, final] and calls == [1] and seen == [False]
    assert sorted(p.name for p in final.iterdir()) == [READY, "a.txt", "b.txt"]
    assert not list(tmp_path.glob(".thing.tmp-*"))


def test_an_interrupted_build_is_cleared_and_a_ready_folder_kept(tmp_path):
    final = tmp_path / "thing"
    final.mkdir()
    (final / "half.bin").write_text("x")  # no READY: a build killed half-way
    (tmp_path / ".thing.tmp-dead").mkdir()  # a killed build's temporary folder
    built_once(final, lambda work: (work / READY).write_text("mine\n"))  # its own READY, written last
    assert sorted(p.name for p in final.iterdir()) == [READY] and (final / READY).read_text() == "mine\n"
    assert not (tmp_path / ".thing.tmp-dead").exists()

    def never(_work: Path) -> None:
        raise AssertionError("a ready folder is not built again")

    assert built_once(final, never) == final


def test_a_failing_build_leaves_nothing_behind(tmp_path):
    final = tmp_path / "thing"

    def fail(work: Path) -> None:
        (work / "a.txt").write_text("a")
        raise RuntimeError("boom")

    try:
        built_once(final, fail)
    except RuntimeError:
        pass
    assert not final.exists() and not list(tmp_path.glob(".thing.tmp-*"))
