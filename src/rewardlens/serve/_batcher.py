"""Dynamic batching: one worker thread owns the model; requests queue and are scored together up to a token
budget, so N callers at once cost about one batched forward, not N.

The worker takes queued requests in arrival order while their tokens fit `max_batch_tokens` (a request
bigger than the budget goes alone), reads them in one `RewardModel.read` (length-sorted forwards of
`batch_size` rows), appends every request's rewards to the request log and syncs it, hands the monitored
samples to the policy monitor (`Roller`, which records on its own thread), and only then answers the callers. A full
queue refuses at once (503); a request whose caller has gone is dropped unscored.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from ..errors import RewardLensError
from ..model import RewardModel
from ._log import Logged, RequestLog
from ._metrics import Metrics
from ._protocol import Job, RequestError
from ._roll import Roller

logger = logging.getLogger("rewardlens.serve")


@dataclass(eq=False)
class Pending:
    """A queued request: its `job`, `id`, `endpoint`, and `answer` (called once, from the worker thread, with
    the rewards or the `RequestError`). `cancelled`: its caller has gone."""

    job: Job
    id: str
    endpoint: str
    answer: Callable[[list[float] | RequestError], None]
    cancelled: bool = False
    seqs: list[Any] | None = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return sum(len(s.ids) for s in self.seqs or ())


class Batcher:
    """The worker thread and its bounded queue (`queue` requests). `max_tokens`: the longest sequence
    accepted (422 above it); `log`: the request log, synced before any answer; `roller`: the monitor's feed."""

    def __init__(self, rm: RewardModel, *, max_batch_tokens: int = 16384, queue: int = 256, batch_size: int = 64,
                 max_tokens: int | None = None, log: RequestLog | None = None, roller: Roller | None = None,
                 metrics: Metrics | None = None) -> None:
        self.rm, self.max_batch_tokens, self.capacity, self.batch_size = rm, max_batch_tokens, queue, batch_size
        self.max_tokens = max_tokens if max_tokens is not None else max_batch_tokens
        self.log, self.roller, self.metrics = log, roller, metrics or Metrics()
        self.lock = roller.lock if roller is not None else threading.Lock()  # the model's: one forward at a time
        self._queue: deque[Pending] = deque()
        self._carry: Pending | None = None
        self._cond = threading.Condition()
        self._stopping = False
        self._held = False
        self._busy = 0
        self._thread = threading.Thread(target=self._run, name="rewardlens-serve-worker", daemon=True)

    # ---- the caller's side (event loop) ------------------------------------------------------
    def start(self) -> None:
        if self.roller is not None:
            self.roller.start()
        self._thread.start()

    def submit(self, pending: Pending) -> None:
        """Queue `pending`, or refuse it: 503 while the queue is full or the server is stopping."""
        with self._cond:
            if self._stopping:
                raise RequestError(503, "the server is shutting down; retry against another replica", retry_after=5)
            if len(self._queue) >= self.capacity:
                raise RequestError(503, f"the queue is full ({self.capacity} requests, --queue); retry shortly",
                                   retry_after=1)
            self._queue.append(pending)
            self._cond.notify()

    @property
    def depth(self) -> int:
        """Requests waiting (not yet taken into a batch)."""
        return len(self._queue) + (self._carry is not None)

    @property
    def in_flight(self) -> int:
        """Requests waiting or being scored."""
        return self.depth + self._busy

    def stop(self, timeout: float | None = None) -> None:
        """Stop taking requests, score every one already queued, then roll the monitor's last batches and close
        the log."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.roller is not None:
            self.roller.stop()
        if self.log is not None:
            self.log.close()

    # ---- the worker --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch:
                self._busy = len(batch)
                self._score(batch)
                self._busy = 0
            elif self._stopping and self.depth == 0:
                return
            if self.roller is not None:
                self._guard(self.roller.tick)

    def hold(self) -> None:
        """Let requests queue without scoring them (until `release`): to drain a replica behind a load balancer
        for a moment, or to fill the queue on purpose (the tests do)."""
        with self._cond:
            self._held = True

    def release(self) -> None:
        """Score again after `hold`."""
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def _pop(self, wait: bool) -> Pending | None:
        with self._cond:
            if wait and not self._queue and not self._stopping:
                self._cond.wait(timeout=0.5)  # wakes to roll the monitor's time windows
            while self._held and not self._stopping:
                self._cond.wait(timeout=0.5)
            return self._queue.popleft() if self._queue else None

    def _take(self) -> list[Pending]:
        """Queued requests in arrival order while their tokens fit the budget (at least one)."""
        batch: list[Pending] = []
        tokens = 0
        while True:
            p, self._carry = (self._carry or self._pop(wait=not batch)), None
            if p is None:
                return batch
            if p.cancelled:
                self.metrics.cancel()
                continue
            if p.seqs is None and not self._tokenize(p):
                continue
            if batch and tokens + p.tokens > self.max_batch_tokens:
                self._carry = p
                return batch
            batch.append(p)
            tokens += p.tokens

    def _tokenize(self, p: Pending) -> bool:
        """Token ids of `p`'s items, or answer it 4xx (over the length limit, or unreadable) and say False."""
        try:
            with self.lock:
                p.seqs, _ = self.rm.encode(p.job.items)
        except RewardLensError as exc:
            p.answer(RequestError(422, str(exc).splitlines()[0]))
            return False
        except TypeError as exc:
            p.answer(RequestError(400, str(exc).splitlines()[0]))
            return False
        long = [(i, len(s.ids)) for i, s in enumerate(p.seqs) if len(s.ids) > self.max_tokens]
        if long:
            i, n = long[0]
            p.answer(RequestError(422, f"item {i} is {n} tokens long, over the server's limit of {self.max_tokens} "
                                       "tokens a sequence (--max-length, else --max-batch-tokens); shorten it"))
            return False
        return True

    def _score(self, batch: list[Pending]) -> None:
        seqs = [s for p in batch for s in p.seqs or ()]
        monitored = self.roller is not None and any(p.job.monitored for p in batch)
        reading = None
        try:
            with self.lock:
                if self.rm.reads.multi:  # a PRM reads several steps a sequence: the read loop reads one
                    rewards = torch.as_tensor(self.rm.score([i for p in batch for i in p.job.items],
                                                            batch_size=self.batch_size))
                else:
                    reading = self.rm.read(seqs, batch_size=self.batch_size, readout=monitored)
                    rewards = reading.reward.detach().float().cpu()
        except Exception:  # a bug or a device fault: these callers get a 500, the server keeps serving
            logger.error("scoring a batch failed:\n%s", traceback.format_exc())
            for p in batch:
                p.answer(RequestError(500, "the server failed to score this batch (see its log); retry"))
            return
        values = [float(r) for r in rewards.tolist()]
        self.metrics.batch(values)
        spans, start = [], 0
        for p in batch:
            spans.append((start, start + len(p.seqs or ())))
            start = spans[-1][1]
        now = time.time()
        if self.log is not None:  # on disk before anyone is answered: nothing acknowledged is lost
            self.log.append([Logged(p.id, p.job.step, now, p.endpoint,
                                    tuple(v if v == v and abs(v) != float("inf") else None for v in values[a:b]))
                             for p, (a, b) in zip(batch, spans)])
        if monitored and reading is not None:  # fed before anyone is answered: an answered sample is in the monitor's
            readout = reading.readout          # batch, so `/alarms` asked after a later step's answer holds this step
            assert readout is not None  # asked for
            for p, (a, b) in zip(batch, spans):
                if p.job.monitored:
                    self._guard(partial(self._feed, p, reading.reward[a:b], reading.hidden[a:b], readout[a:b]))
        for p, (a, b) in zip(batch, spans):
            p.answer(values[a:b])

    def _feed(self, p: Pending, reward: Any, hidden: Any, readout: Any) -> None:
        assert self.roller is not None
        with self.lock:  # the tokenizer is the model's: counted here, so the monitor thread never touches it
            n_tokens = self.roller.monitor.completion_tokens(p.job.texts)
        self.roller.add(p.job.step, p.job.items, p.job.texts, n_tokens, reward, hidden, readout)

    def _guard(self, work: Callable[[], None]) -> None:
        """Run the monitor's `work`; a failure there is logged, never allowed to stop the scoring."""
        try:
            work()
        except Exception:
            logger.error("the policy monitor failed:\n%s", traceback.format_exc())
