"""The read-position residuals the audit's divergence fits its natural distribution on.

Divergence fits the natural distribution of every side's read-position residual, at every layer,
before it scores any patched run (docs/patching.md). The audit traces every pair's residuals head-less
before its per-pair stage (`trace`, per pair [2, L, d], chosen then rejected, on the CPU in the trace's
dtype), in the chunks' own spans and batch size, so they are those the chunks' traces take, and fits
once (`fit`); `scoring` holds that fit for the run's later steps.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..causal.internal import NaturalFit, natural_states
from ..data.internal import pair_span, rows_of
from ..errors import UsageError
from ..model import RewardModel, TraceKey
from ..model.internal import Tokenized
from ._keys import fingerprint


class NaturalStates:
    """Each computed pair's read-position residuals by its unit (`content_key`): [2, L, d], all of one model.

    A unit names a pair's contents, not the model that read it, so the states are bound to the first model
    that keeps or fits with them (its `fingerprint`, as the store keys runs): another model's residuals would
    fit another distribution silently, and a second model is refused by name instead."""

    def __init__(self) -> None:
        self.by_unit: dict[str, Tensor] = {}
        self.model: str | None = None
        """The `fingerprint` of the model the states belong to (None until one keeps or fits with them)."""
        self._seen: weakref.ref[RewardModel] | None = None  # the last model checked, so a chunk hashes nothing
        self.scoring: object | None = None
        """The run's fit once made (`audit._divergence.Scoring`), for the run's later steps."""

    def bind(self, model: RewardModel) -> None:
        """Tie the states to `model`, or refuse a model other than the one they belong to."""
        if self._seen is not None and self._seen() is model:
            return
        mine = fingerprint(model)
        if self.model is not None and mine != self.model:
            raise UsageError(f"these NaturalStates hold the residuals of model {self.model}, and this model is "
                             f"{mine} (other config, dtype, head or read options): a fit over them would describe "
                             "the other model; pass a fresh NaturalStates() for each model")
        self.model, self._seen = mine, weakref.ref(model)

    def keep(self, model: RewardModel, units: Sequence[str], captured: Mapping[TraceKey, Tensor]) -> None:
        """Keep the residuals of the pairs `units` from a trace of their sides (`captured`: `TraceKey.resid(l)`
        → [2·len(units), d], pairs in order); a trace without them (a reward read at a set of positions, which
        divergence leaves out) keeps nothing."""
        self.bind(model)
        keys = [TraceKey.resid(layer) for layer in range(model.n_layers)]
        if not all(k in captured for k in keys):
            return
        stacked = torch.stack([captured[k] for k in keys], dim=1).cpu()  # [2n, L, d]
        for j, unit in enumerate(units):
            self.by_unit[unit] = stacked[pair_span(j, j + 1)]

    def trace(self, model: RewardModel, seqs: Sequence[Tokenized], units: Sequence[str], batch_size: int) -> None:
        """Trace and keep the residuals of the pairs `units` (their token ids `seqs`, chosen and rejected
        interleaved) in one batch loop of `batch_size` sequences, length-sorted as a chunk's trace batches them;
        `OutOfMemoryError` names the pairs that fit in no batch (nothing is kept then)."""
        self.bind(model)
        if units:
            self.keep(model, units, natural_states(model, list(seqs), batch_size, is_pairs=True))

    def missing(self, units: Sequence[str]) -> int:
        """How many of the pairs `units` (a unit given twice counts twice) this run did not keep."""
        return sum(unit not in self.by_unit for unit in units)

    def fit(self, model: RewardModel, seqs: Sequence[Tokenized], units: Sequence[str], batch_size: int
            ) -> NaturalFit:
        """The natural fit over both sides of every pair `units` (their token ids `seqs`, chosen and rejected
        interleaved): kept residuals where this run computed the pair, the rest traced here."""
        self.bind(model)
        missing = [j for j, unit in enumerate(units) if unit not in self.by_unit]
        traced = {k: v.cpu() for k, v in natural_states(
            model, [seqs[row] for j in missing for row in rows_of(j)], batch_size).items()} if missing else {}
        at = {j: k for k, j in enumerate(missing)}  # pair j is the k-th traced pair

        def side_rows(layer: int) -> Tensor:
            """[2·len(units), d] on the CPU: every side's residual after `layer`, pairs in order."""
            key = TraceKey.resid(layer)
            return torch.cat([traced[key][pair_span(at[j], at[j] + 1)] if j in at else self.by_unit[u][:, layer]
                              for j, u in enumerate(units)])

        return NaturalFit(model, {TraceKey.resid(layer): side_rows(layer) for layer in range(model.n_layers)})


__all__ = ["NaturalStates"]
