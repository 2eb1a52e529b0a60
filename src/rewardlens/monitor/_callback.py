"""`RewardLensCallback`: the monitor as a `transformers.TrainerCallback`, built only when asked for."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..data import Pair
from ..errors import UsageError
from ._monitor import Monitor
from ._trajectory import Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, TrainerControl, TrainerState, TrainingArguments


@lru_cache(maxsize=1)
def callback_class() -> type:  # noqa: C901 -- a class body counted as one function: each method is short
    """The `RewardLensCallback` class (`rewardlens.monitor.RewardLensCallback`), made on first use."""
    from transformers import TrainerCallback

    class RewardLensCallback(TrainerCallback):
        """A `transformers.TrainerCallback` (any Trainer, TRL's `RewardTrainer` included) that
        snapshots the model every `every` optimiser steps, at the start of training (step 0, when
        `at_start`) and at the end. Takes `Monitor`'s options; `tokenizer` defaults to the
        trainer's `processing_class`. The whole run is in `.trajectory`.

        Where the metrics go: a snapshot at a training step asks the trainer to log at that step
        (`control.should_log`), and its `{"rewardlens/<metric>": ...}` join the `logs` of that
        `Trainer.log` call in `on_log` — so they sit in `state.log_history` with the loss, and the
        reporters (W&B, TensorBoard, ...) receive them when this callback runs before theirs:
        `cb.attach(trainer)` puts it first (`callbacks=[cb]` or `add_callback` put it after the
        reporters, which then log before the snapshot joins). The trainer's own `log` is not called
        a second time: TRL's trainers average and clear their running metrics in it. The step-0 and
        end-of-training snapshots have no `Trainer.log` call of their own; they are appended to
        `state.log_history` directly. Only the world's main process measures (sharded FSDP / ZeRO-3
        models are not supported).
        """

        def __init__(self, pairs: Sequence[Pair], *, every: int = 100, tokenizer: PreTrainedTokenizerBase | None = None,
                     at_start: bool = True, **monitor_kwargs: Any) -> None:
            self.monitor = Monitor(pairs, every=every, **monitor_kwargs)
            self.tokenizer, self.at_start = tokenizer, at_start
            self._pending: dict[str, float] = {}

        def attach(self, trainer: Any) -> Any:
            """Put this callback first in `trainer`'s callbacks (before the reporters); returns `trainer`."""
            callbacks = trainer.callback_handler.callbacks
            if self in callbacks:
                callbacks.remove(self)
            callbacks.insert(0, self)
            return trainer

        @property
        def trajectory(self) -> Trajectory:
            return self.monitor.trajectory

        def _take(self, state: TrainerState, kwargs: dict[str, Any], force: bool,
                  control: TrainerControl | None = None) -> None:
            if not state.is_world_process_zero:
                return
            tok = self.tokenizer if self.tokenizer is not None else kwargs.get("processing_class")
            if tok is None:
                raise UsageError("RewardLensCallback needs a tokenizer: pass tokenizer= or give the trainer a "
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
                if control is not None:  # a training step: join the trainer's own log call at this step
                    self._pending = entry
                    control.should_log = True
                    return
                if state.epoch is not None:
                    entry["epoch"] = state.epoch
                state.log_history.append({**entry, "step": step})

        # The events keep TrainerCallback's parameter names (mypy holds an override to them, as a caller
        # may pass them by keyword), so the ones an event does not use carry a noqa instead of an underscore.
        def on_log(self, args: TrainingArguments, state: TrainerState,  # noqa: ARG002 -- event signature
                   control: TrainerControl, logs: dict[str, Any] | None = None,  # noqa: ARG002 -- event signature
                   **kwargs: Any) -> None:
            if not self._pending or logs is None:
                return
            logs.update(self._pending)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(self._pending)  # Trainer.log appended a copy of logs just before
            self._pending = {}

        def on_train_begin(self, args: TrainingArguments, state: TrainerState,  # noqa: ARG002 -- event signature
                           control: TrainerControl, **kwargs: Any) -> None:  # noqa: ARG002 -- event signature
            if self.at_start and state.global_step == 0:
                self._take(state, kwargs, force=True)

        def on_step_end(self, args: TrainingArguments, state: TrainerState,  # noqa: ARG002 -- event signature
                        control: TrainerControl, **kwargs: Any) -> None:
            self._take(state, kwargs, force=False, control=control)

        def on_train_end(self, args: TrainingArguments, state: TrainerState,  # noqa: ARG002 -- event signature
                         control: TrainerControl, **kwargs: Any) -> None:  # noqa: ARG002 -- event signature
            self._take(state, kwargs, force=True)

    RewardLensCallback.__module__ = __name__.rpartition(".")[0]  # the face that hands it out: rewardlens.monitor
    return RewardLensCallback
