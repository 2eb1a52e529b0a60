"""`RewardLensCallback`: the monitor as a `transformers.TrainerCallback`, built only when asked for."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..data import Pair
from ._monitor import Monitor
from ._trajectory import Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, TrainerControl, TrainerState, TrainingArguments


@lru_cache(maxsize=1)
def callback_class() -> type:
    """The `RewardLensCallback` class (`rewardlens.monitor.RewardLensCallback`), made on first use."""
    from transformers import TrainerCallback

    class RewardLensCallback(TrainerCallback):
        """A `transformers.TrainerCallback` (any Trainer, TRL's `RewardTrainer` included) that
        snapshots the model every `every` optimiser steps, at the start of training (step 0, when
        `at_start`) and at the end. Takes `Monitor`'s options; `tokenizer` defaults to the
        trainer's `processing_class`. Each snapshot is appended to `state.log_history` as
        `{"step": ..., "rewardlens/<metric>": ...}`; the whole run is in `.trajectory`.
        Only the world's main process measures (sharded FSDP / ZeRO-3 models are not supported).
        """

        def __init__(self, pairs: Sequence[Pair], *, every: int = 100, tokenizer: PreTrainedTokenizerBase | None = None,
                     at_start: bool = True, **monitor_kwargs: Any) -> None:
            self.monitor = Monitor(pairs, every=every, **monitor_kwargs)
            self.tokenizer, self.at_start = tokenizer, at_start

        @property
        def trajectory(self) -> Trajectory:
            return self.monitor.trajectory

        def _take(self, state: TrainerState, kwargs: dict[str, Any], force: bool) -> None:
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
            model = kwargs["model"]
            snap = self.monitor.snapshot(model, tok, step) if force else self.monitor(model, tok, step)
            if snap is not None:
                entry = {f"rewardlens/{k}": v for k, v in snap.metrics.items()}
                entry.update({f"rewardlens/probe/{a}": float(v) for a, v in zip(snap.axes, snap.probe_effect)})
                if state.epoch is not None:
                    entry["epoch"] = state.epoch
                state.log_history.append({**entry, "step": step})

        def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> None:
            if self.at_start and state.global_step == 0:
                self._take(state, kwargs, force=True)

        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                        **kwargs: Any) -> None:
            self._take(state, kwargs, force=False)

        def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                         **kwargs: Any) -> None:
            self._take(state, kwargs, force=True)

    RewardLensCallback.__module__ = __name__.rpartition(".")[0]  # the face that hands it out: rewardlens.monitor
    return RewardLensCallback
