"""The causal dose-response of a concept: reward as a direction is added at one layer, α by α, batched."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from ..model import RewardModel, TraceKey
from ..model.internal import Batch, Tokenized, rewriting
from ..types import Positions


def dose_response(model: RewardModel, seqs: list[Tokenized], label: str, shift: Tensor, alphas: np.ndarray,
                  positions: Positions, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(reward at α = 0 [n], reward(α) − reward(0) [n_alphas, n]) with `α · shift` added at `label`;
    all α of an input run in one forward, one α per row."""
    a = len(alphas)
    zero = int(np.flatnonzero(alphas == 0)[0])
    if label == str(model.n_layers - 1):
        return _dose_last(model, seqs, shift, alphas, positions, batch_size)
    module, where = (model.layers[0], "in") if label == "embed" else (model.layers[int(label)], "out")
    out, base = np.zeros((a, len(seqs))), np.zeros(len(seqs))
    per = max(1, batch_size // a)  # inputs per forward: about `batch_size` rows in all

    def rep(t: Tensor) -> Tensor:
        return t.repeat_interleave(a, 0)

    for rows, batch in model.batches(seqs, per):
        types = batch.token_type_ids
        big = replace(batch, input_ids=rep(batch.input_ids), attention_mask=rep(batch.attention_mask),
                      position_ids=rep(batch.position_ids), token_type_ids=None if types is None else rep(types),
                      read_at=rep(batch.read_index), labels=None if batch.labels is None
                      else [x for x in batch.labels for _ in range(a)])
        coef = torch.as_tensor(alphas, dtype=torch.float32, device=model.device).repeat(len(rows))
        add = coef[:, None] * shift[None]  # [rows, d], fp32

        def push(x: Tensor, add: Tensor = add, big: Batch = big) -> Tensor:
            if positions == "all":
                mask = big.attention_mask.to(x.device, x.dtype)[:, :, None]
                return x + mask * add.to(x.device, x.dtype)[:, None]
            x = x.clone()
            r = torch.arange(x.shape[0], device=x.device)
            x[r, big.read_index.to(x.device)] += add.to(x.device, x.dtype)
            return x

        with rewriting([(module, where, push)]):
            values, weights = model.head_readout(model.run(big, model.final_points(big)))
        _record(out, base, rows, (values * weights).sum(-1), a, zero)
    return base, out


def _record(out: np.ndarray, base: np.ndarray, rows: np.ndarray, reward: Tensor, a: int, zero: int) -> None:
    """Write a batch's rewards [rows * a] (each input once per α) into `out` (reward(α) − reward(0),
    [a, n]) and `base` (reward(0), [n])."""
    r = reward.double().cpu().numpy().reshape(len(rows), a)
    out[:, rows] = (r - r[:, zero:zero + 1]).T
    base[rows] = r[:, zero]


def _dose_last(model: RewardModel, seqs: list[Tokenized], shift: Tensor, alphas: np.ndarray, positions: Positions,
               batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`dose_response` at the last layer's output without a dosed forward: nothing but the final norm and
    the head reads it, so reward(α) is the head on (final residual + α · shift), exactly. One clean
    forward per input instead of one per (input, α): the default dose layer costs no more than a
    score. The gate (ArmoRM) moves with the dose where every position is dosed, as in a forward."""
    a, zero = len(alphas), int(np.flatnonzero(alphas == 0)[0])
    coef = torch.as_tensor(alphas, dtype=torch.float32, device=model.device)
    out, base = np.zeros((a, len(seqs))), np.zeros(len(seqs))
    for rows, batch in model.batches(seqs, batch_size):
        captured = model.run(batch, model.final_points(batch))
        dosed = {}
        for key, x in captured.items():
            x = x.float().repeat_interleave(a, 0)  # [rows * a, d]: each input once per α
            moves = key == TraceKey.final() or positions == "all"
            dosed[key] = x + coef.repeat(len(rows))[:, None] * shift.to(x.device)[None] if moves else x
        values, weights = model.head_readout(dosed)
        _record(out, base, rows, (values * weights).sum(-1), a, zero)
    return base, out


def needs_no_forward(model: RewardModel, label: str, positions: Positions) -> bool:
    """Whether the dose at `label` is the head on a clean read's final residual plus the shift (`dose_read`):
    at the last layer's output, where nothing but the final norm and the head reads it, and with a readout
    that does not move with it (the read position alone dosed, or no gate read elsewhere)."""
    return label == str(model.n_layers - 1) and (positions == "read" or not model.gated)


def dose_read(model: RewardModel, final: Tensor, coefficients: Tensor, shift: Tensor, alphas: np.ndarray,
              rows: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """`dose_response` at the last layer's output from a reading, without a forward: `final` [n, d] the
    clean final residuals and `coefficients` [n, k] the readout a `Reading` holds. What `_dose_last`
    computes where the readout does not move with the dose (the read position alone is dosed, or the
    head has no gate); `rows` inputs at a time."""
    a, zero = len(alphas), int(np.flatnonzero(alphas == 0)[0])
    coef = torch.as_tensor(alphas, dtype=torch.float32, device=final.device)
    out, base = np.zeros((a, len(final))), np.zeros(len(final))
    for start in range(0, len(final), rows):
        index = np.arange(start, min(start + rows, len(final)))
        x = final[index].float().repeat_interleave(a, 0)  # [rows * a, d]: each input once per α
        x = x + coef.repeat(len(index))[:, None] * shift.to(x.device)[None]
        values = model.head_values(model.final_hidden(x), None)
        _record(out, base, index, (values * coefficients[index].repeat_interleave(a, 0)).sum(-1), a, zero)
    return base, out
