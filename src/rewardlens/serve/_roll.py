"""Gathers the scored traffic into the policy monitor's batches: one `PolicyRecord` per training step.

A caller that sends its trainer's `step` has every sample of that step gathered, in arrival order, into one
batch; the batch is handed to the monitor (`PolicyMonitor.observe_read`: no second forward) when a sample of
a later step arrives, or when the server stops. A caller that sends no step is rolled by time: window `k`
holds the samples that arrived between `k · seconds` and `(k + 1) · seconds` after the first, and rolls once
its time is past. A sample of a step already rolled (a straggling worker) starts a batch of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..monitor import PolicyMonitor, PolicyRecord
from ..types import Text


@dataclass
class _Batch:
    items: list[Text] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    reward: list[torch.Tensor] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    readout: list[torch.Tensor] = field(default_factory=list)


class Roller:
    """Feeds `monitor` one batch per step (or time window of `seconds`); `on_record` sees each record."""

    def __init__(self, monitor: PolicyMonitor, seconds: float = 60.0,
                 on_record: Callable[[PolicyRecord], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.monitor, self.seconds, self.on_record, self.clock = monitor, seconds, on_record, clock
        self._pending: dict[int, _Batch] = {}
        self._start: float | None = None
        self._by_time = False  # one caller sent no step: windows of time roll by the clock
        self._lock = threading.Lock()  # the worker adds and ticks; the server's shutdown flushes

    def _window(self) -> int:
        now = self.clock()
        if self._start is None:
            self._start = now
        return int((now - self._start) // self.seconds)

    def add(self, step: int | None, items: list[Text], texts: list[str], reward: torch.Tensor, hidden: torch.Tensor,
            readout: torch.Tensor) -> None:
        """One request's scored samples (rows of `reward` [n], `hidden` [n, d], `readout` [n, d])."""
        with self._lock:
            self._by_time = self._by_time or step is None
            key = self._window() if step is None else step
            self._roll(lambda s: s < key)
            batch = self._pending.setdefault(key, _Batch())
            batch.items += items
            batch.texts += texts
            batch.reward.append(reward.cpu())
            batch.hidden.append(hidden.cpu())
            batch.readout.append(readout.cpu())

    def tick(self) -> None:
        """Roll time windows that are over (stepped batches wait for a later step)."""
        with self._lock:
            if self._by_time and self._pending:
                now = self._window()
                self._roll(lambda s: s < now)

    def flush(self) -> None:
        """Roll every batch still gathering (the server is stopping)."""
        with self._lock:
            self._roll(lambda _s: True)

    def _roll(self, due: Callable[[int], bool]) -> None:
        for step in sorted(s for s in self._pending if due(s)):
            b = self._pending.pop(step)
            record = self.monitor.observe_read(b.items, b.texts, torch.cat(b.reward), torch.cat(b.hidden),
                                               torch.cat(b.readout), step)
            if self.on_record is not None:
                self.on_record(record)

    @property
    def gathering(self) -> dict[int, int]:
        """{step: samples} of the batches still gathering."""
        with self._lock:
            return {s: len(b.items) for s, b in self._pending.items()}
