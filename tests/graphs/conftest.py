"""Random transcoders for the tiny models (the same attributes as trained ones), and one short pair."""

from __future__ import annotations

import pytest
import torch

from rewardlens import Pair
from rewardlens.sae import Transcoder, TranscoderConfig, Transcoders

SHORT = Pair("Capital of France?", "Paris.", "It is Rome, I think.")
"""A pair whose sides share the prompt and differ in the response (the margin graph's prefix rule)."""


def random_transcoders(model, d_sae: int = 96, k: int = 8, seed: int = 0, skip: bool = True) -> Transcoders:
    """One transcoder per layer with every weight (decoder, biases, skip) away from zero, so a graph that dropped
    a bias or a path could not close by accident."""
    d, gen, out = model.d_model, torch.Generator().manual_seed(seed), {}
    for layer in range(model.n_layers):
        tc = Transcoder(TranscoderConfig(layer=layer, d_in=d, d_out=d, d_sae=d_sae, k=k, skip=skip), seed=seed + layer)
        with torch.no_grad():
            tc.W_dec.copy_(torch.randn(d_sae, d, generator=gen) * 0.1)
            tc.b_dec.copy_(torch.randn(d, generator=gen) * 0.1)
            tc.b_enc.copy_(torch.randn(d_sae, generator=gen) * 0.1)
            if skip:
                tc.W_skip.copy_(torch.randn(d, d, generator=gen) * 0.05)
        out[layer] = tc
    return Transcoders(out)


@pytest.fixture(scope="module")
def short_pair() -> Pair:
    return SHORT
