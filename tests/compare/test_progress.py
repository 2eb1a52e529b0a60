"""`compare(progress=True)` shows a tqdm bar on stderr; the default prints nothing."""

from __future__ import annotations

import pytest

import rewardlens as rl


@pytest.mark.parametrize("progress", [True, False])
def test_compare_progress(tiny_root, pairs, progress, capsys):
    model = rl.load(str(tiny_root["llama"]))
    rl.compare(model, model, pairs, n_boot=20, progress=progress)
    err = capsys.readouterr().err
    assert ("compare" in err) == progress
    assert err == "" or progress


class _Bar:
    """A stand-in for the tqdm bar that records every position it is moved to and every step it names."""

    def __init__(self, total, desc, enabled, *, unit="it"):
        self.total, self.unit, self.n, self.seen, self.names = total, unit, 0, [], []

    def update(self, k):
        self.n += k
        self.seen.append((self.n, self.names[-1] if self.names else None))

    def set_postfix_str(self, name, refresh=True):
        self.names.append(name)

    def refresh(self):
        pass

    def close(self):
        pass


def test_the_bar_moves_per_batch_of_sequences_inside_each_step(tiny_root, pairs, monkeypatch):
    """Before, the bar moved once per analysis: a side's lens over thousands of pairs showed no motion."""
    import importlib

    comparing = importlib.import_module("rewardlens.compare._compare")  # `rl.compare` is the function

    made = []
    monkeypatch.setattr(comparing, "progress_bar", lambda *a, **k: made.append(_Bar(*a, **k)) or made[-1])
    model = rl.load(str(tiny_root["llama"]))
    rl.compare(model, model, pairs, n_boot=20, batch_size=2, progress=True)
    bar, n = made[0], len(pairs)
    assert bar.unit == "seq" and bar.total == 2 * 2 * n + 2 * 2 * n  # lens + attribution, then the directions
    assert bar.n == bar.total  # it ends where it says
    lens = [k for k, name in bar.seen if name == "A: lens"]
    assert all(isinstance(k, int) for k, _ in bar.seen) and lens == sorted(set(lens))  # whole sequences, forward
    assert lens[0] < 2 and lens[-1] == 2 * n  # it moves inside the first batch of 2 and ends with the step
    assert len(lens) > n  # more often than once per batch: each batch's layers move it
    assert {name for _, name in bar.seen} == {"A: lens", "A: attribution", "directions"}
