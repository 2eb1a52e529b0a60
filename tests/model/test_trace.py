"""The trace keeps one position per row, and half-precision backbones keep an fp32 read-out."""

import numpy as np
import pytest
import torch

import rewardlens as rl
from rewardlens.model import TraceKey, trace
from rewardlens.model.internal import collate


def test_trace_holds_only_the_read_position(tiny_root, pairs):
    model = rl.load(str(tiny_root["llama"]))
    seqs, _ = model.encode(pairs)
    # one padded batch of every sequence (`batches` would cut it where padding passes the slack)
    batch = collate(seqs, pad_id=model.pad_token_id, side="right", first=model.encoder, device=model.device)
    assert batch.input_ids.shape[1] > 10
    tr = trace(model, batch, heads=range(model.n_layers), neurons=range(model.n_layers))
    # Neuron level keeps [n, d_mlp] per layer, never [n, tokens, d_mlp].
    assert all(t.ndim == 2 and t.shape[0] == len(seqs) and t.dtype == torch.float32 for t in tr.captured.values())
    assert tr[TraceKey.mlp_act(0)].shape[1] == model.model.config.intermediate_size


def test_bfloat16_backbone_keeps_an_fp32_head_and_closes_to_bf16_precision(tiny_root, pairs):
    full = rl.load(str(tiny_root["llama"]))
    half = rl.load(str(tiny_root["llama"]), dtype="bfloat16")
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert half.head.weight.dtype == torch.float32
    ref = full.score(pairs)
    np.testing.assert_allclose(half.score(pairs), ref, atol=0.05 * np.abs(ref).max())
    att = rl.attribute(half, pairs)
    assert np.abs(att.residual_error).max() < 0.02 * np.abs(att.values).sum(1).max()
    assert att.values.dtype == np.float32


def test_lens_crystallization_rule():
    from rewardlens.exact import Lens

    # Two pairs over depths 0..4: the first settles at depth 2, the second's final margin is ~0.
    chosen = np.array([[0.0, -1.0, 2.0, 1.5, 2.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
    rejected = np.zeros_like(chosen)
    lin = np.stack([chosen[0], rejected[0], chosen[1], rejected[1]])
    ln = Lens(linear=lin, normed=lin, reward=lin[:, -1], linear_objectives=lin[:, None], normed_objectives=lin[:, None],
              rows=["0/c", "0/r", "1/c", "1/r"], is_pairs=True)
    depth = ln.crystallization("linear", fraction=0.5)
    assert depth[0] == pytest.approx(2 / 4) and np.isnan(depth[1])
    assert ln.crystallization("linear", fraction=1.0)[0] == pytest.approx(4 / 4)
    assert ln.near_zero_margin().tolist() == [False, True]
