"""Gathers the scored traffic into the policy monitor's batches, one `PolicyRecord` per training step, and
computes the records on a thread of their own, so a record's bootstrap never holds up the scoring.

A caller that sends its trainer's `step` has every sample of that step gathered, in arrival order, into one
batch; the batch is due when a sample of a later step arrives, or when the server stops. A caller that sends
no step is rolled by time: window `k` holds the samples that arrived between `k · seconds` and
`(k + 1) · seconds` after the first, and is due once its time is past. A sample of a step already rolled (a
straggling worker) starts a batch of its own.

The monitor thread computes due batches in order (`PolicyMonitor.observe_read`, with the completions'
token counts the worker took, so the reward model is not touched), except a record whose exact parts
attribution is due (`parts_due`): that one runs a traced forward, under the model's `lock`, which the worker
holds while it reads.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..monitor import PolicyMonitor, PolicyRecord
from ..types import Text

logger = logging.getLogger("rewardlens.serve")


@dataclass
class _Batch:
    items: list[Text] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    n_tokens: list[int] = field(default_factory=list)
    reward: list[torch.Tensor] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    readout: list[torch.Tensor] = field(default_factory=list)


class Roller:
    """Feeds `monitor` one batch per step (or time window of `seconds`) from its own thread; `on_record` sees
    each record; `lock` is the model's (held by whoever runs a forward)."""

    def __init__(self, monitor: PolicyMonitor, seconds: float = 60.0,
                 on_record: Callable[[PolicyRecord], None] | None = None, *, lock: threading.Lock | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.monitor, self.seconds, self.on_record, self.clock = monitor, seconds, on_record, clock
        self.lock = lock or threading.Lock()
        self._pending: dict[int, _Batch] = {}
        self._due: deque[tuple[int, _Batch]] = deque()
        self._start: float | None = None
        self._by_time = False  # a caller sent no step: windows of time roll by the clock
        self._cond = threading.Condition()
        self._busy = self._stopping = False
        self._thread = threading.Thread(target=self._work, name="rewardlens-serve-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _window(self) -> int:
        now = self.clock()
        if self._start is None:
            self._start = now
        return int((now - self._start) // self.seconds)

    def add(self, step: int | None, items: list[Text], texts: list[str], n_tokens: list[int], reward: torch.Tensor,
            hidden: torch.Tensor, readout: torch.Tensor) -> None:
        """One request's scored samples (rows of `reward` [n], `hidden` [n, d], `readout` [n, d]) and its
        completions' token counts."""
        with self._cond:
            self._by_time = self._by_time or step is None
            key = self._window() if step is None else step
            self._roll(lambda s: s < key)
            batch = self._pending.setdefault(key, _Batch())
            batch.items += items
            batch.texts += texts
            batch.n_tokens += n_tokens
            batch.reward.append(reward.detach().cpu())
            batch.hidden.append(hidden.detach().cpu())
            batch.readout.append(readout.detach().cpu())

    def tick(self) -> None:
        """Roll the time windows that are over (stepped batches wait for a later step)."""
        with self._cond:
            if self._by_time and self._pending:
                now = self._window()
                self._roll(lambda s: s < now)

    def flush(self) -> None:
        """Roll every batch still gathering and wait until the monitor has recorded them all."""
        with self._cond:
            self._roll(lambda _s: True)
            while (self._due or self._busy) and self._thread.is_alive():
                self._cond.wait(timeout=0.5)

    def settle(self, timeout: float = 30.0) -> int:
        """Wait, up to `timeout` seconds, until every batch already rolled is recorded (batches still gathering
        are left alone); return the backlog left (0 once settled). `/alarms` and the dashboard answer after it,
        so a step that a later step's sample closed is in their answer, not still on the monitor's thread."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._due or self._busy) and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)
            return len(self._due) + self._busy

    def stop(self) -> None:
        """`flush`, then end the monitor thread."""
        self.flush()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _roll(self, due: Callable[[int], bool]) -> None:
        for step in sorted(s for s in self._pending if due(s)):
            self._due.append((step, self._pending.pop(step)))
        self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._due and not self._stopping:
                    self._cond.wait()
                if not self._due:
                    return
                step, batch = self._due.popleft()
                self._busy = True
            try:
                self._record(step, batch)
            except Exception:  # the monitor's failure is logged; scoring goes on
                logger.error("the policy monitor failed on step %s:\n%s", step, traceback.format_exc())
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _record(self, step: int, b: _Batch) -> None:
        mon = self.monitor
        args = (b.items, b.texts, torch.cat(b.reward), torch.cat(b.hidden), torch.cat(b.readout), step, b.n_tokens)
        if mon.parts_due:  # a traced forward of the shared model: not while the worker reads
            with self.lock:
                record = mon.observe_read(*args)
        else:
            record = mon.observe_read(*args)
        if self.on_record is not None:
            self.on_record(record)

    @property
    def gathering(self) -> dict[int, int]:
        """{step: samples} of the batches still gathering."""
        with self._cond:
            return {s: len(b.items) for s, b in self._pending.items()}

    @property
    def backlog(self) -> int:
        """Batches due that the monitor has not recorded yet."""
        return len(self._due) + self._busy
