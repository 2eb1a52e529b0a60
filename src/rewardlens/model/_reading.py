"""The read loop (`RewardModel.read`) and what it returns, `Reading`: what the head reads at the read
position, one row per sequence."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from ._hooks import Point, PointKey
from ._keys import TraceKey
from ._reads import one_read_only

if TYPE_CHECKING:
    import numpy as np
    from torch import nn

    from ._readout import Head
    from ._reads import Reads
    from ._tokens import Batch, Tokenized


@dataclass(frozen=True)
class Reading:
    """What the head reads at the read position `t*`, one row per sequence (fp32, on the model's device).

    `final` [N, d] the residual the final norm reads; `hidden` [N, d] the head's input ĥ (the final
    norm's output); `layers` {label: [N, d]} the residual after each asked depth (`"embed"` = input of
    layer 0, `"l"` = output of layer `l`); `values` [N, k] the head's objectives; `coefficients`
    [N, k] the readout (ArmoRM's frozen gate; ones for a single output); `readout` [N, d] the
    effective read-out vector `Σ_k coefficients_k · row_k(ĥ)` when asked for, else None.
    """

    final: Tensor
    hidden: Tensor
    layers: dict[str, Tensor]
    values: Tensor
    coefficients: Tensor
    readout: Tensor | None

    @property
    def reward(self) -> Tensor:
        """The scalar reward [N]."""
        return (self.values * self.coefficients).sum(-1)


class Reader(Protocol):
    """What the read loop reads of a `RewardModel` (which sits above this module: a protocol, no import)."""

    reads: Reads
    """Where the reward is read: the loop reads one token per sequence."""
    head: Head
    """The fp32 head."""
    device: torch.device
    """Where the head runs and every captured point lands."""

    @property
    def d_model(self) -> int:
        """The residual width."""
        ...

    @property
    def n_layers(self) -> int:
        """How many transformer layers."""
        ...

    @property
    def layers(self) -> nn.ModuleList:
        """The transformer layers, in order."""
        ...

    @property
    def gated(self) -> bool:
        """Whether the readout coefficients come from a gate read at its own position."""
        ...

    def batches(self, seqs: list[Tokenized], batch_size: int) -> Iterator[tuple[np.ndarray, Batch]]:
        """Length-sorted batches, with each batch's original row indices."""
        ...

    def final_points(self, batch: Batch, *, gate: bool = True) -> dict[TraceKey, Point]:
        """The capture points the head needs (`final`, and a gated head's `gate`)."""
        ...

    def run(self, batch: Batch, points: Mapping[PointKey, Point]) -> dict[PointKey, Tensor]:
        """One no-grad forward of the backbone: the captured points in fp32, by their keys."""
        ...

    def final_hidden(self, x: Tensor) -> Tensor:
        """The head's input [n, d] from the captured final residual [n, d]."""
        ...

    def coefficients(self, captured: Mapping[TraceKey, Tensor]) -> Tensor:
        """Readout coefficients [n, k] from captured final points."""
        ...


class Sink:
    """What the read loop fills, one row per sequence (its docstring says what each argument asks for):
    the read position's captures of a batch go in with `fill`, and `reading()` hands them back. `step(n)`
    (a progress bar's update) hears of each `n` rows filled for the first time: a row filled again (a
    shared read whose proof failed, read plainly after it) is not counted twice."""

    def __init__(self, model: Reader, n: int, *, layers: Sequence[str], gate: bool, readout: bool,
                 step: Callable[[int], object] | None = None) -> None:
        if model.reads.multi:
            raise one_read_only("the read loop (`RewardModel.read`)")
        k, d = model.head.n_objectives, model.d_model
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float32, device=model.device)  # noqa: E731
        self.model, self.gate, self.step = model, gate, step
        self.filled = torch.zeros(n, dtype=torch.bool)
        self.final, self.hidden, self.values, self.coef = zeros(n, d), zeros(n, d), zeros(n, k), zeros(n, k)
        self.kept = {label: zeros(n, d) for label in layers}
        self.keys = {label: TraceKey.embed() if label == "embed" else TraceKey.resid(range(model.n_layers)[int(label)])
                     for label in layers}
        self.vectors = zeros(n, d) if readout else None
        self.unread_gate = not gate and model.gated
        if self.unread_gate:
            self.coef.fill_(float("nan"))

    def depths(self, cols: Tensor, rows: Tensor | None = None) -> dict[TraceKey, Point]:
        """The asked depths' capture points at columns `cols` [n] (of rows `rows`, default all): the input of
        layer 0 for "embed", a layer's output for "l"."""
        points = {}
        for key in self.keys.values():
            where = (self.model.layers[0], "in") if key.layer is None else (self.model.layers[key.layer], "out")
            points[key] = Point(*where, cols, rows)
        return points

    def fill(self, index: Tensor, captured: Mapping[TraceKey, Tensor]) -> None:
        """Rows `index` [b] from one batch's captures at their read positions (`final`, the depths, a gate)."""
        model = self.model
        h = model.final_hidden(captured[TraceKey.final()])
        self.final[index], self.hidden[index], self.values[index] = captured[TraceKey.final()], h, model.head(h)
        if not self.unread_gate:
            self.coef[index] = model.coefficients(captured)
        for label, key in self.keys.items():
            self.kept[label][index] = captured[key]
        if self.vectors is not None:
            head_rows, _ = model.head.rows(h)
            self.vectors[index] = (self.coef[index][:, :, None] * head_rows).sum(1)
        rows = index.cpu()
        first = int((~self.filled[rows]).sum())
        self.filled[rows] = True
        if self.step is not None and first:
            self.step(first)

    def reading(self) -> Reading:
        """Everything filled, as the `Reading` the read loop returns."""
        return Reading(self.final, self.hidden, self.kept, self.values, self.coef, self.vectors)


def read_loop(model: Reader, seqs: list[Tokenized], sink: Sink, *, batch_size: int,
              index: Sequence[int] | None = None) -> None:
    """`RewardModel.read`'s plain loop: one batched no-grad forward per batch, capturing only the read
    position, into `sink` at rows `index` (each sequence's row there; default 0..n-1)."""
    at = torch.as_tensor(list(range(len(seqs))) if index is None else list(index), dtype=torch.long)
    for rows, batch in model.batches(seqs, batch_size):
        points: dict[TraceKey, Point] = {**model.final_points(batch, gate=sink.gate), **sink.depths(batch.read_index)}
        sink.fill(at[torch.as_tensor(rows, dtype=torch.long)].to(model.device), model.run(batch, points))
