"""`train_sae` warns when it ran too few optimiser steps, or too few activations, for its latents."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

from rewardlens.errors import RewardLensWarning
from rewardlens.sae import SAEConfig, TrainConfig, train_sae
from rewardlens.sae._activations import Activations


class _Rows:
    """A fixed set of random activations, in chunks of 64 (what `train_sae` iterates)."""

    def __init__(self, n_rows: int, d_in: int = 8) -> None:
        self.x = torch.randn(n_rows, d_in, generator=torch.Generator().manual_seed(0))
        self.d_in, self.n_rows = d_in, n_rows

    def __iter__(self) -> Iterator[Activations]:
        for i in range(0, self.n_rows, 64):
            x = self.x[i:i + 64]
            yield Activations(x, torch.zeros(len(x), dtype=torch.long), torch.arange(len(x)))


def test_three_steps_warn_and_name_the_fixes() -> None:
    cfg = TrainConfig(sae=SAEConfig(num_latents=64, k=4), batch_size=64, buffer_rows=64)
    with pytest.warns(RewardLensWarning, match="ran 3 optimiser step") as record:
        result = train_sae(_Rows(192), cfg)
    assert len(result.fvu) == 3
    message = str(record[0].message)
    for name in ("batch_size", "epochs", "num_latents", "--sae-batch-size", "--epochs", "--latents",
                 "--expansion-factor"):
        assert name in message


def test_too_few_firings_per_latent_warn_even_with_many_steps() -> None:
    # 200 steps of 1 activation: 200 × 1 / 64 latents ≈ 3 firings each
    cfg = TrainConfig(sae=SAEConfig(num_latents=64, k=1), batch_size=1, buffer_rows=64)
    with pytest.warns(RewardLensWarning, match="firings per latent"):
        train_sae(_Rows(200), cfg)


def test_enough_steps_and_firings_do_not_warn() -> None:
    cfg = TrainConfig(sae=SAEConfig(num_latents=16, k=4), batch_size=8, buffer_rows=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RewardLensWarning)
        result = train_sae(_Rows(832), cfg)  # 104 steps, 832 × 4 / 16 = 208 firings per latent
    assert len(result.fvu) >= 100
