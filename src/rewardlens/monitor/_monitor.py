"""The monitor: measure a model from inside a training loop without disturbing the training."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import nn

from ..data import Pair, margin
from ..errors import DataError, UsageError
from ..exact import attribute, lens
from ..hacking import probe
from ..model import ArchitectureMap, Part, RewardModel, verify, wrap
from ..model.internal import eval_mode, finite_accuracy
from ..types import LensKind, Level
from ._trajectory import GROUPS, Snapshot, Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@contextlib.contextmanager
def untouched(model: nn.Module) -> Iterator[None]:
    """No grad, no autocast, every module in eval mode (each flag restored) and the torch RNG
    forked, so what runs inside leaves training exactly as it was and measures the weights in
    their own dtype."""
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    # accelerate's mixed precision (TRL's default bf16=True) replaces the instance's forward by an
    # autocast one; the exact read-out needs the weights' own precision, so the original is
    # put back for the snapshot and the patched one restored after it.
    patched = model.__dict__.get("forward") if "_original_forward" in model.__dict__ else None
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=devices))
        stack.enter_context(torch.no_grad())
        for kind in {p.device.type for p in model.parameters()} & {"cpu", "cuda"}:
            stack.enter_context(torch.autocast(kind, enabled=False))
        stack.enter_context(eval_mode(model))
        if patched is not None:
            model.forward = model.__dict__["_original_forward"]  # accelerate keeps it on the instance
        try:
            yield
        finally:
            if patched is not None:
                model.forward = patched


def _check_pairs(pairs: Sequence[Pair]) -> list[Pair]:
    pairs = list(pairs)
    if not pairs or not all(isinstance(p, Pair) for p in pairs):
        got = "nothing" if not pairs else type(next(p for p in pairs if not isinstance(p, Pair))).__name__
        raise DataError(f"the monitor needs a non-empty list of rewardlens.Pair, got {got}; build pairs with "
                        "rewardlens.Pair(prompt, chosen, rejected) or rewardlens.load_pairs(file)")
    return pairs


def _probe_items(probe_items: int | Sequence[Any] | None) -> Sequence[Any] | None:
    """An int takes that many built-in items spread evenly over their domains; else as given."""
    if not isinstance(probe_items, int):
        return probe_items
    from ..hacking import spread_items

    return spread_items(probe_items)


def measure(
    rm: RewardModel, pairs: Sequence[Pair], step: int, *, level: Level = "sublayer", fraction: float = 0.5,
    probes: Sequence[str] = (), probe_items: int | Sequence[Any] | None = 12, batch_size: int = 8,
) -> Snapshot:
    """Lens, attribution and (when `probes` names axes) probe metrics of a wrapped model on `pairs`.

    Metrics: `accuracy` (share of pairs with a positive margin), `margin` (mean chosen − rejected
    reward), `crystallization_linear`/`_normed` (median over pairs of `Lens.crystallization` at
    `fraction`, pairs with a near-zero margin left out; NaN when all are), `closure_error` (max
    |reward − Σ parts − constant|), `margin_{embed,attn,mlp}` (summed mean margin contribution of
    each group of parts) and `share_{group}` (= margin_group / Σ |margin_group|, so the shares'
    absolute values add to 1 and the sign says which way the group pushes).
    """
    ln = lens(rm, pairs, batch_size=batch_size)
    att = attribute(rm, pairs, level=level, batch_size=batch_size, per_objective=False)
    gap = margin(ln.reward)
    finite = gap[np.isfinite(gap)]  # a non-finite reward is left out, never counted as a loss
    metrics = {"accuracy": finite_accuracy(gap), "margin": float(np.mean(finite)) if len(finite) else np.nan}
    kinds: tuple[LensKind, ...] = ("linear", "normed")
    for kind in kinds:
        depth = ln.crystallization(kind, fraction)
        finite = np.isfinite(depth)
        metrics[f"crystallization_{kind}"] = float(np.median(depth[finite])) if finite.any() else np.nan
    metrics["closure_error"] = float(np.abs(att.residual_error).max())
    part_margin = att.margin.mean(0).astype(np.float64)
    group = {g: float(sum(v for name, v in zip(att.names, part_margin) if Part.parse(name).kind == g)) for g in GROUPS}
    total = sum(abs(v) for v in group.values())
    metrics.update({f"margin_{g}": group[g] for g in GROUPS})
    metrics.update({f"share_{g}": group[g] / total if total > 0 else np.nan for g in GROUPS})
    effect = np.zeros(0)
    if probes:
        pr = probe(rm, _probe_items(probe_items), axes=list(probes), quality=False, n_boot=100, batch_size=batch_size)
        effect = pr.mean.astype(np.float64)
    return Snapshot(int(step), metrics, ln.linear[:, -1].astype(np.float64), tuple(att.names), part_margin,
                    tuple(probes), effect)


class Monitor:
    """Snapshots a Hugging Face sequence-classification model every `every` steps on fixed `pairs`.

    Call it as `monitor(model, tokenizer, step)` from any loop (it is also the `callback` of
    `rewardlens.zoo.organisms` training); `snapshot(...)` forces one. `level` is the attribution's
    ('sublayer' or 'head'); `probes` names probe axes (True: all; keep it to a few, on
    `probe_items` items, for cost); `path` appends each snapshot as one JSON line, flushed to disk,
    so a crash loses nothing (`Trajectory.from_jsonl` reads it back). Remaining keywords go to
    `rewardlens.wrap` (`readout=`, `pad_token_id=`, `max_length=`, ...).
    """

    def __init__(
        self, pairs: Sequence[Pair], *, every: int = 100, level: Literal["sublayer", "head"] = "sublayer",
        fraction: float = 0.5, probes: Sequence[str] | bool | None = None, probe_items: int | Sequence[Any] | None = 12,
        path: str | os.PathLike[str] | None = None, batch_size: int = 8, **wrap_kwargs: Any,
    ) -> None:
        from ..hacking import AXES

        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise UsageError(f"every must be a positive number of steps, got {every!r}")
        if level not in ("sublayer", "head"):
            raise UsageError(f"level must be 'sublayer' or 'head' (neuron level is too costly per step), got {level!r}")
        axes = list(AXES) if probes is True else list(probes or ())
        unknown = [a for a in axes if a not in AXES]
        if unknown:
            raise UsageError(f"unknown probe axes {unknown}; choose from {list(AXES)}")
        self.pairs, self.every, self.level, self.fraction = _check_pairs(pairs), every, level, fraction
        self.axes, self.probe_items, self.batch_size = tuple(axes), _probe_items(probe_items), batch_size
        self.path = None if path is None else Path(path)
        self.wrap_kwargs = wrap_kwargs
        self.snapshots: list[Snapshot] = []
        self._arch: ArchitectureMap | None = None

    def __call__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, step: int) -> Snapshot | None:
        """Take a snapshot when `step` is a multiple of `every` (and none was taken at it yet)."""
        if step % self.every or (self.snapshots and self.snapshots[-1].step == step):
            return None
        return self.snapshot(model, tokenizer, step)

    def snapshot(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, step: int) -> Snapshot:
        """Measure `model` now (see `measure`), record it and append it to `path`."""
        with untouched(model):
            snap = measure(self._wrap(model, tokenizer), self.pairs, step, level=self.level, fraction=self.fraction,
                           probes=self.axes, probe_items=self.probe_items, batch_size=self.batch_size)
        self.snapshots.append(snap)
        if self.path is not None:  # flushed and synced before training resumes: a crash loses nothing
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(snap.to_json() + "\n")
                f.flush()
                os.fsync(f.fileno())
        return snap

    def _wrap(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> RewardModel:
        # A fresh wrap per snapshot: RewardModel's fp32 head and norm copies are from the step it
        # was built at. The map and structure are proven once; the head is re-proven every time.
        if self._arch is None:
            rm = wrap(model, tokenizer, **self.wrap_kwargs)
            self._arch = rm.arch
            return rm
        with warnings.catch_warnings():  # the first snapshot already said whatever loading warns
            warnings.simplefilter("ignore")
            rm = RewardModel.from_model(model, tokenizer, arch=self._arch, **self.wrap_kwargs)
            verify(rm)
        return rm

    @property
    def trajectory(self) -> Trajectory:
        """Every snapshot so far."""
        return Trajectory.from_snapshots(self.snapshots)
