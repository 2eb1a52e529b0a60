"""`progress=True` shows a tqdm bar on stderr for probes and concepts; the default prints nothing."""

from __future__ import annotations

import pytest

import rewardlens as rl

TEXTS = (["Here is a list:\n- one\n- two", "Steps:\n- first\n- second", "- a\n- b\n- c"],
         ["Here is one sentence.", "First do this, then that.", "A, B and C."])


@pytest.fixture(scope="module")
def model(tiny_root):
    return rl.load(str(tiny_root["llama"]), truncation="left")


@pytest.mark.parametrize("progress", [True, False])
def test_probe_progress(model, pairs, progress, capsys):
    rl.probe(model, pairs, n_boot=50, progress=progress)
    err = capsys.readouterr().err
    assert ("probe: scoring" in err) == progress
    assert err == "" or progress


@pytest.mark.parametrize("progress", [True, False])
def test_concepts_progress(model, progress, capsys):
    rl.concepts(model, {"lists": TEXTS}, n_boot=50, progress=progress)
    err = capsys.readouterr().err
    assert ("concepts: read and dose" in err) == progress
    assert err == "" or progress
