"""Activation capture and SAE training show a tqdm bar on stderr when asked; the default prints nothing."""

from __future__ import annotations

import pytest

import rewardlens as rl
from rewardlens.sae import ActivationSource, SAEConfig, TrainConfig, train_sae
from rewardlens.zoo import DEMO_PAIRS

TEXTS = [t for p in DEMO_PAIRS for t in (p.chosen, p.rejected)]


@pytest.mark.filterwarnings("ignore:SAE training ran")
@pytest.mark.parametrize("progress", [True, False])
def test_capture_and_training_progress(tiny_root, progress, capsys):
    model = rl.load(str(tiny_root["llama"]))
    source = ActivationSource(model, TEXTS, "resid_0", positions="all", batch_size=4, progress=progress)
    cfg = TrainConfig(sae=SAEConfig(expansion_factor=2, k=4), batch_size=64, epochs=1, buffer_rows=256)
    train_sae(source, cfg, progress=progress)
    err = capsys.readouterr().err
    assert ("sae: activations at resid_0" in err) == progress
    assert ("sae: training" in err) == progress
    assert "it/s" not in err or progress
