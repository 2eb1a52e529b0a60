"""The server's counters, written as Prometheus' text exposition format (`GET /metrics`), version 0.0.4."""

from __future__ import annotations

import math
import threading
from collections import Counter, deque
from collections.abc import Sequence

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (s) of the request latency histogram."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds (sequences) of the batch size histogram."""
REWARD_WINDOW = 1024
"""How many of the latest rewards the reward mean and sd gauges cover."""


class Histogram:
    """A cumulative histogram with fixed bucket bounds, as Prometheus reads one."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum, self.n = 0.0, 0

    def observe(self, value: float) -> None:
        i = next((k for k, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.sum += value
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, total = [], 0
        sep = "," if labels else ""
        for bound, count in zip([*map(_number, self.bounds), "+Inf"], self.counts):
            total += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {total}')
        tail = f"{{{labels}}}" if labels else ""
        return [*out, f"{name}_sum{tail} {_number(self.sum)}", f"{name}_count{tail} {self.n}"]


def _number(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x)) if abs(x) < 1e15 else repr(float(x))


class Metrics:
    """Everything `/metrics` shows, updated from the event loop and the worker thread under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batches = Histogram(BATCH_BUCKETS)
        self.sequences = 0
        self.cancelled = 0
        self.alarms = 0
        self.records = 0
        self._rewards: deque[float] = deque(maxlen=REWARD_WINDOW)

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if endpoint in ("/get_reward", "/score"):
                self.latency.observe(seconds)

    def batch(self, rewards: Sequence[float]) -> None:
        with self._lock:
            self.batches.observe(len(rewards))
            self.sequences += len(rewards)
            self._rewards.extend(r for r in rewards if math.isfinite(r))

    def cancel(self) -> None:
        with self._lock:
            self.cancelled += 1

    def record(self, alarms: int) -> None:
        with self._lock:
            self.records += 1
            self.alarms += alarms

    def reward_stats(self) -> tuple[float, float]:
        """Mean and sd of the latest `REWARD_WINDOW` finite rewards (NaN when none)."""
        with self._lock:
            xs = list(self._rewards)
        if not xs:
            return math.nan, math.nan
        mean = sum(xs) / len(xs)
        return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))

    def text(self, queue_depth: int, in_flight: int) -> str:
        """The exposition text."""
        mean, sd = self.reward_stats()
        with self._lock:
            out = ["# HELP rewardlens_requests_total HTTP requests answered, by endpoint and status code.",
                   "# TYPE rewardlens_requests_total counter"]
            out += [f'rewardlens_requests_total{{endpoint="{e}",code="{c}"}} {n}'
                    for (e, c), n in sorted(self.requests.items())]
            out += ["# HELP rewardlens_request_seconds Time from a scoring request's arrival to its answer.",
                    "# TYPE rewardlens_request_seconds histogram", *self.latency.lines("rewardlens_request_seconds"),
                    "# HELP rewardlens_batch_sequences Sequences per batched forward.",
                    "# TYPE rewardlens_batch_sequences histogram", *self.batches.lines("rewardlens_batch_sequences"),
                    "# HELP rewardlens_sequences_total Sequences scored.", "# TYPE rewardlens_sequences_total counter",
                    f"rewardlens_sequences_total {self.sequences}",
                    "# HELP rewardlens_cancelled_total Requests dropped unscored because their caller disconnected.",
                    "# TYPE rewardlens_cancelled_total counter", f"rewardlens_cancelled_total {self.cancelled}",
                    "# HELP rewardlens_queue_depth Requests waiting for the model.",
                    "# TYPE rewardlens_queue_depth gauge",
                    f"rewardlens_queue_depth {queue_depth}",
                    "# HELP rewardlens_in_flight Requests queued or being scored.", "# TYPE rewardlens_in_flight gauge",
                    f"rewardlens_in_flight {in_flight}",
                    f"# HELP rewardlens_reward_mean Mean of the latest {REWARD_WINDOW} rewards.",
                    "# TYPE rewardlens_reward_mean gauge", f"rewardlens_reward_mean {_number(mean)}",
                    f"# HELP rewardlens_reward_sd Standard deviation of the latest {REWARD_WINDOW} rewards.",
                    "# TYPE rewardlens_reward_sd gauge", f"rewardlens_reward_sd {_number(sd)}",
                    "# HELP rewardlens_monitor_records_total Steps the policy monitor has rolled into a record.",
                    "# TYPE rewardlens_monitor_records_total counter",
                    f"rewardlens_monitor_records_total {self.records}",
                    "# HELP rewardlens_alarms_total Alarms the policy monitor raised (one per record that raised it).",
                    "# TYPE rewardlens_alarms_total counter", f"rewardlens_alarms_total {self.alarms}"]
        return "\n".join(out) + "\n"
