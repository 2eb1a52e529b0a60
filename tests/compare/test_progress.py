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
