"""Watch a reward model while it trains: lens, attribution and probe metrics on fixed pairs.

```python
mon = Monitor(pairs, every=50, probes=["length"], path="run/monitor.jsonl")
mon(model, tokenizer, step)            # in any loop, after optimizer.step(): measures when step % every == 0
mon.trajectory.to_frame()              # one row per snapshot; .plot() for the curves
trainer.add_callback(RewardLensCallback(pairs, every=50))   # any transformers Trainer, TRL's RewardTrainer
```

A snapshot runs under `torch.no_grad()`, without autocast, with every module in eval mode (each
module's own flag restored) and the torch RNG forked: training goes on exactly as without it. Each
snapshot wraps the model afresh: `RewardModel` keeps fp32 copies of the head and norm weights,
which go stale as soon as the optimiser steps. See docs/monitor.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .data import Pair, margin
from .errors import DataError
from .exact import attribute, lens
from .hacking import probe
from .model import KINDS, Part, RewardModel, eval_mode, verify, wrap

GROUPS = KINDS
LENS_METRICS = ("accuracy", "margin", "crystallization_linear", "crystallization_normed")
METRICS = LENS_METRICS + ("closure_error",) + tuple(f"margin_{g}" for g in GROUPS) + tuple(f"share_{g}" for g in GROUPS)
"""Per-snapshot scalars, in this order (see `snapshot`)."""


@dataclass(frozen=True)
class Snapshot:
    """One step's measurements. `metrics` maps each name of `METRICS` to a float; `rewards` [2n]
    is the lens' final value (= the model's reward) per sequence, chosen and rejected interleaved;
    `part_margin` [P] each part's mean chosen − rejected contribution (reward units);
    `probe_effect` [A] each probe axis' mean effect (reward units, with − without)."""

    step: int
    metrics: dict[str, float]
    rewards: np.ndarray
    parts: tuple[str, ...]
    part_margin: np.ndarray
    axes: tuple[str, ...] = ()
    probe_effect: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def to_json(self) -> str:
        """One JSON line (NaN written as null)."""
        clean = lambda x: None if not np.isfinite(x) else float(x)
        return json.dumps({
            "step": self.step, "metrics": {k: clean(v) for k, v in self.metrics.items()},
            "rewards": [clean(x) for x in self.rewards], "parts": dict(zip(self.parts, map(clean, self.part_margin))),
            "probes": dict(zip(self.axes, map(clean, self.probe_effect))),
        })

    @classmethod
    def from_json(cls, line: str) -> Snapshot:
        rec = json.loads(line)
        arr = lambda xs: np.array([np.nan if x is None else x for x in xs], dtype=np.float64)
        return cls(int(rec["step"]), {k: np.nan if v is None else float(v) for k, v in rec["metrics"].items()},
                   arr(rec["rewards"]), tuple(rec["parts"]), arr(rec["parts"].values()),
                   tuple(rec["probes"]), arr(rec["probes"].values()))


@dataclass(frozen=True)
class Trajectory:
    """Snapshots over training: `steps` [T]; `values` [T, M] the scalars named by `metrics`;
    `rewards` [T, 2n] per-sequence rewards; `part_margin` [T, P] per-part mean margin contribution
    (parts named by `parts`); `probe_effect` [T, A] per-axis mean probe effect (axes named by `axes`).
    Reward units throughout; crystallization depths as l / L; shares in [-1, 1]."""

    steps: np.ndarray
    metrics: tuple[str, ...]
    values: np.ndarray
    rewards: np.ndarray
    parts: tuple[str, ...]
    part_margin: np.ndarray
    axes: tuple[str, ...]
    probe_effect: np.ndarray

    @classmethod
    def from_snapshots(cls, snaps: Sequence[Snapshot]) -> Trajectory:
        snaps = list(snaps)
        first = snaps[0] if snaps else Snapshot(0, {m: np.nan for m in METRICS}, np.zeros(0), (), np.zeros(0))
        for s in snaps:
            if s.parts != first.parts or s.axes != first.axes or len(s.rewards) != len(first.rewards):
                raise DataError(f"snapshot at step {s.step} measured other parts, axes or pairs than the one at "
                                f"step {first.step}; a trajectory needs the same pairs and options throughout")
        stack = lambda rows, width: np.array(rows, dtype=np.float64).reshape(len(snaps), width)
        return cls(
            steps=np.array([s.step for s in snaps], dtype=np.int64), metrics=METRICS,
            values=stack([[s.metrics[m] for m in METRICS] for s in snaps], len(METRICS)),
            rewards=stack([s.rewards for s in snaps], len(first.rewards)), parts=first.parts,
            part_margin=stack([s.part_margin for s in snaps], len(first.parts)), axes=first.axes,
            probe_effect=stack([s.probe_effect for s in snaps], len(first.axes)),
        )

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike) -> Trajectory:
        """Read the lines a `Monitor(path=...)` wrote; a last line cut short by a crash is skipped."""
        lines = [x for x in Path(path).read_text().splitlines() if x.strip()]
        snaps = []
        for i, line in enumerate(lines):
            try:
                snaps.append(Snapshot.from_json(line))
            except (json.JSONDecodeError, KeyError) as exc:
                if i < len(lines) - 1:
                    raise DataError(f"{path}: line {i + 1} is not a monitor snapshot ({exc}); only the last line "
                                    "may be cut short by a crash — was the file written by rewardlens.Monitor?") from None
        return cls.from_snapshots(snaps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, name: str) -> np.ndarray:
        """A metric's values [T] by name, or a probe axis' effect as `probe/<axis>`."""
        if name in self.metrics:
            return self.values[:, self.metrics.index(name)]
        if name.startswith("probe/") and name[6:] in self.axes:
            return self.probe_effect[:, self.axes.index(name[6:])]
        raise KeyError(f"no metric {name!r}; metrics: {list(self.metrics)} and probe/<axis> for axes {list(self.axes)}")

    @property
    def margins(self) -> np.ndarray:
        """Per-pair final margins [T, n] (chosen − rejected reward)."""
        return margin(self.rewards, axis=1)

    def top(self, n: int = 5, at: int = -1) -> list[tuple[str, float]]:
        """The `n` parts with the largest |mean margin contribution| at snapshot index `at`."""
        row = self.part_margin[at]
        return [(self.parts[i], float(row[i])) for i in np.argsort(-np.abs(row))[:n]]

    def to_frame(self):
        """One row per snapshot (index `step`): every metric, then `probe/<axis>` columns."""
        import pandas as pd

        cols = {m: self.values[:, i] for i, m in enumerate(self.metrics)}
        cols.update({f"probe/{a}": self.probe_effect[:, i] for i, a in enumerate(self.axes)})
        return pd.DataFrame(cols, index=pd.Index(self.steps, name="step"))

    def parts_frame(self):
        """Per-part mean margin contribution: one row per snapshot, one column per part."""
        import pandas as pd

        return pd.DataFrame(self.part_margin, columns=list(self.parts), index=pd.Index(self.steps, name="step"))

    def plot(self):
        """Curves against step: margin and accuracy, crystallization depths, margin shares, probes."""
        import matplotlib.pyplot as plt

        panels = 4 if self.axes else 3
        fig, axs = plt.subplots(1, panels, figsize=(4 * panels, 3.2))
        axs[0].plot(self.steps, self["margin"], marker="o", label="mean margin")
        twin = axs[0].twinx()
        twin.plot(self.steps, self["accuracy"], color="tab:green", marker=".", label="accuracy")
        twin.set_ylim(0, 1.05)
        axs[0].set_ylabel("margin (reward units)")
        twin.set_ylabel("accuracy")
        for kind in ("linear", "normed"):
            axs[1].plot(self.steps, self[f"crystallization_{kind}"], marker="o", label=f"{kind} lens")
        axs[1].set_ylabel("median crystallization depth (l / L)")
        axs[1].set_ylim(-0.05, 1.05)
        for g in GROUPS:
            axs[2].plot(self.steps, self[f"share_{g}"], marker="o", label=g)
        axs[2].set_ylabel("share of margin")
        for a in self.axes:
            axs[3].plot(self.steps, self[f"probe/{a}"], marker="o", label=a)
        if self.axes:
            axs[3].set_ylabel("probe effect (reward units)")
        for ax in axs:
            ax.set_xlabel("step")
            ax.legend(fontsize="small")
        fig.tight_layout()
        return fig


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
            model.forward = model._original_forward
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


def _probe_items(probe_items: int | Sequence | None) -> Sequence | None:
    """An int takes that many built-in items spread evenly over their domains; else as given."""
    if not isinstance(probe_items, int):
        return probe_items
    from .hacking import ITEMS

    if not 2 <= probe_items <= len(ITEMS):
        raise ValueError(f"probe_items must be between 2 and {len(ITEMS)} built-in items, got {probe_items}")
    return [ITEMS[int(i)] for i in np.linspace(0, len(ITEMS) - 1, probe_items).round()]


def measure(
    rm: RewardModel, pairs: Sequence[Pair], step: int, *, level: str = "sublayer", fraction: float = 0.5,
    probes: Sequence[str] = (), probe_items: int | Sequence | None = 12, batch_size: int = 8,
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
    metrics = {"accuracy": float(np.mean(gap > 0)), "margin": float(np.mean(gap))}
    for kind in ("linear", "normed"):
        depth = ln.crystallization(kind, fraction)
        metrics[f"crystallization_{kind}"] = float(np.median(depth[np.isfinite(depth)])) if np.isfinite(depth).any() else np.nan
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
    `rewardlens.organisms.train.train`); `snapshot(...)` forces one. `level` is the attribution's
    ('sublayer' or 'head'); `probes` names probe axes (True: all; keep it to a few, on
    `probe_items` items, for cost); `path` appends each snapshot as one JSON line, flushed to disk,
    so a crash loses nothing (`Trajectory.from_jsonl` reads it back). Remaining keywords go to
    `rewardlens.wrap` (`readout=`, `pad_token_id=`, `max_length=`, ...).
    """

    def __init__(
        self, pairs: Sequence[Pair], *, every: int = 100, level: str = "sublayer", fraction: float = 0.5,
        probes: Sequence[str] | bool | None = None, probe_items: int | Sequence | None = 12,
        path: str | os.PathLike | None = None, batch_size: int = 8, **wrap_kwargs,
    ) -> None:
        from .hacking import AXES

        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive number of steps, got {every!r}")
        if level not in ("sublayer", "head"):
            raise ValueError(f"level must be 'sublayer' or 'head' (neuron level is too costly per step), got {level!r}")
        axes = list(AXES) if probes is True else list(probes or ())
        unknown = [a for a in axes if a not in AXES]
        if unknown:
            raise ValueError(f"unknown probe axes {unknown}; choose from {list(AXES)}")
        self.pairs, self.every, self.level, self.fraction = _check_pairs(pairs), every, level, fraction
        self.axes, self.probe_items, self.batch_size = tuple(axes), _probe_items(probe_items), batch_size
        self.path = None if path is None else Path(path)
        self.wrap_kwargs = wrap_kwargs
        self.snapshots: list[Snapshot] = []
        self._arch = None

    def __call__(self, model: nn.Module, tokenizer, step: int) -> Snapshot | None:
        """Take a snapshot when `step` is a multiple of `every` (and none was taken at it yet)."""
        if step % self.every or (self.snapshots and self.snapshots[-1].step == step):
            return None
        return self.snapshot(model, tokenizer, step)

    def snapshot(self, model: nn.Module, tokenizer, step: int) -> Snapshot:
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

    def _wrap(self, model: nn.Module, tokenizer) -> RewardModel:
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


def __getattr__(name: str):
    # transformers' Trainer machinery is imported only when the callback is asked for.
    if name == "RewardLensCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@lru_cache(maxsize=1)
def _callback_class() -> type:
    from transformers import TrainerCallback

    class RewardLensCallback(TrainerCallback):
        """A `transformers.TrainerCallback` (any Trainer, TRL's `RewardTrainer` included) that
        snapshots the model every `every` optimiser steps, at the start of training (step 0, when
        `at_start`) and at the end. Takes `Monitor`'s options; `tokenizer` defaults to the
        trainer's `processing_class`. Each snapshot is appended to `state.log_history` as
        `{"step": ..., "rewardlens/<metric>": ...}`; the whole run is in `.trajectory`.
        Only the world's main process measures (sharded FSDP / ZeRO-3 models are not supported).
        """

        def __init__(self, pairs: Sequence[Pair], *, every: int = 100, tokenizer=None, at_start: bool = True,
                     **monitor_kwargs) -> None:
            self.monitor = Monitor(pairs, every=every, **monitor_kwargs)
            self.tokenizer, self.at_start = tokenizer, at_start

        @property
        def trajectory(self) -> Trajectory:
            return self.monitor.trajectory

        def _take(self, state, kwargs: dict, force: bool) -> None:
            if not state.is_world_process_zero:
                return
            tok = self.tokenizer if self.tokenizer is not None else kwargs.get("processing_class")
            if tok is None:
                raise ValueError("RewardLensCallback needs a tokenizer: pass tokenizer= or give the trainer a "
                                 "processing_class")
            step = int(state.global_step)
            done = self.monitor.snapshots and self.monitor.snapshots[-1].step == step
            if force and done:
                return
            snap = self.monitor.snapshot(kwargs["model"], tok, step) if force else self.monitor(kwargs["model"], tok, step)
            if snap is not None:
                entry = {f"rewardlens/{k}": v for k, v in snap.metrics.items()}
                entry.update({f"rewardlens/probe/{a}": float(v) for a, v in zip(snap.axes, snap.probe_effect)})
                if state.epoch is not None:
                    entry["epoch"] = state.epoch
                state.log_history.append({**entry, "step": step})

        def on_train_begin(self, args, state, control, **kwargs):
            if self.at_start and state.global_step == 0:
                self._take(state, kwargs, force=True)

        def on_step_end(self, args, state, control, **kwargs):
            self._take(state, kwargs, force=False)

        def on_train_end(self, args, state, control, **kwargs):
            self._take(state, kwargs, force=True)

    RewardLensCallback.__module__ = __name__
    return RewardLensCallback
