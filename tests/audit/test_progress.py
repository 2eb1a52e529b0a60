"""The audit's whole-model step shows its instruments' own bars (they move while it runs)."""

from __future__ import annotations

import pytest

import rewardlens as rl
from rewardlens.audit import Plan, Store
from rewardlens.audit.internal import run_whole


@pytest.mark.filterwarnings("ignore:left truncation")
@pytest.mark.parametrize("progress", [True, False])
def test_whole_model_progress(tiny_root, pairs, progress, capsys):
    model = rl.load(str(tiny_root["llama"]), truncation="left")
    store = Store(":memory:")
    try:
        run_whole(model, pairs, store, Plan(concepts=False, probe_items=4), progress=progress)
    finally:
        store.close()
    err = capsys.readouterr().err
    assert ("audit: whole-model instruments" in err) == progress
    assert ("probe: scoring" in err) == progress


def test_the_pairs_bar_moves_once_per_pair_inside_a_chunk(tiny_root, monkeypatch):
    """A chunk's pairs are stored together at its end, but the bar moves as its sequences run: after the first
    pair (its own chunk, which says what a pair costs), the count passes every pair on the way, in order."""
    from rewardlens.audit import _runner

    shown: list[int] = []

    class Bar:
        n = 0

        def update(self, k=1):
            self.n += k
            shown.append(self.n)

        def set_postfix_str(self, text):
            pass

        def close(self):
            pass

    monkeypatch.setattr(_runner, "progress_bar", lambda *a, **k: Bar())
    model = rl.load(str(tiny_root["llama"]))
    pairs = [rl.Pair(f"Question {i}: is the sky blue?", "Yes, it is blue.", "No, it is green.") for i in range(11)]
    store = Store(":memory:")
    try:
        computed = _runner.run_pairs(model, pairs, store, Plan(chunk_size=5, batch_size=2), progress=True)
    finally:
        store.close()
    assert computed == 11 and shown[-1] == 11
    assert sorted(set(shown)) == list(range(1, 12)) and shown == sorted(shown)  # every pair, never backwards
