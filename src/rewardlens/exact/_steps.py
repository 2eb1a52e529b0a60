"""Per-read results of a multi-position read-out (a PRM's steps, a DPO reward's response tokens).

A trace of such a model has one row per read; its decomposition is exact per read, and the fold
`F` [n, m] (α of each read for its sequence, model/_reads.py) turns every per-read array into the
sequence's: `X_seq = F · X_read`, exact because every α is fixed on this input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..model.internal import Batch
from ..plotting import HtmlView

STEP_FIELDS = ("sequence", "step", "position", "weight", "reward", "constant")
"""The per-read columns every `Steps` has (its `values`, per part, are optional)."""


@dataclass(frozen=True)
class Steps(HtmlView):
    """One row per read: `sequence` [M] (its row in the inputs, pairs interleaved chosen, rejected),
    `step` [M] (its index within the sequence), `position` [M] (its token position in the unpadded
    sequence), `weight` [M] (α: how much it counts in the sequence's reward), `reward` [M] (its own
    score `r_k`), `values` [M, P] (its parts, scalar readout; None when not kept) and `constant` [M]
    (its head constant, with any offset such as a DPO reference's term), so
    `reward = values.sum(-1) + constant` per read."""

    sequence: np.ndarray
    step: np.ndarray
    position: np.ndarray
    weight: np.ndarray
    reward: np.ndarray
    constant: np.ndarray
    values: np.ndarray | None
    names: list[str]

    def to_frame(self) -> pd.DataFrame:
        """One row per read: sequence, step, position, weight, reward (and each part when kept)."""
        frame = pd.DataFrame({"sequence": self.sequence, "step": self.step, "position": self.position,
                              "weight": self.weight, "reward": self.reward, "constant": self.constant})
        if self.values is not None:
            frame = pd.concat([frame, pd.DataFrame(self.values, columns=self.names)], axis=1)
        return frame

    def of(self, sequence: int) -> pd.DataFrame:
        """The reads of one sequence, in step order."""
        frame = self.to_frame()
        return frame[frame["sequence"] == sequence].reset_index(drop=True)


def fold(weights: Tensor | None, x: Tensor) -> Tensor:
    """`x` [m, ...] per read → [n, ...] per sequence with the fold `weights` [n, m]; `x` itself when
    there is one read per row (`weights` None)."""
    if weights is None:
        return x
    return torch.einsum("nm,m...->n...", weights.to(x.dtype), x)


def batch_steps(
    batch: Batch, rows: np.ndarray, weights: Tensor, reward: Tensor, constant: Tensor, values: Tensor | None
) -> dict[str, np.ndarray]:
    """One batch's per-read columns (numpy), with `rows` the batch rows' numbers in the inputs."""
    assert batch.reads is not None  # only multi-position batches have steps
    reads = batch.reads
    read_rows = reads.rows.cpu().numpy()
    shift = (batch.attention_mask.argmax(-1)).cpu().numpy()  # left padding moves positions right
    out = {
        "sequence": np.asarray(rows)[read_rows], "step": reads.steps.cpu().numpy(),
        "position": reads.cols.cpu().numpy() - shift[read_rows],
        "weight": weights[torch.as_tensor(read_rows, device=weights.device),
                          torch.arange(reads.size, device=weights.device)].cpu().numpy(),
        "reward": reward.cpu().numpy(), "constant": constant.cpu().numpy(),
    }
    if values is not None:
        out["values"] = values.cpu().numpy()
    return out


def join_steps(chunks: list[dict[str, np.ndarray]], names: list[str]) -> Steps:
    """The `Steps` of a whole call from its batches' columns, ordered by sequence then step."""
    cat = {key: np.concatenate([c[key] for c in chunks]) for key in chunks[0]}
    order = np.lexsort((cat["step"], cat["sequence"]))
    values = cat["values"][order].astype(np.float32) if "values" in cat else None
    return Steps(cat["sequence"][order], cat["step"][order], cat["position"][order],
                 cat["weight"][order].astype(np.float32), cat["reward"][order].astype(np.float32),
                 cat["constant"][order].astype(np.float32), values, names)
