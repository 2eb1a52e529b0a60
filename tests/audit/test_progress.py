"""The audit's whole-model step shows its instruments' own bars (they move while it runs)."""

from __future__ import annotations

import pytest

import rewardlens as rl
from rewardlens.audit import Plan, Store, run_whole


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
