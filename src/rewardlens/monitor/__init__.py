"""Watch a reward model while it trains: lens, attribution and probe metrics on fixed pairs.

```python
mon = Monitor(pairs, every=50, probes=["length"], path="run/monitor.jsonl")
mon(model, tokenizer, step)            # in any loop, after optimizer.step(): measures when step % every == 0
mon.trajectory.to_frame()              # one row per snapshot; .plot() for the curves
trainer.add_callback(RewardLensCallback(pairs, every=50))   # any transformers Trainer, TRL's RewardTrainer

reward = monitored_reward(rm, log="run/policy.jsonl")   # watch a *policy* trained against rm (TRL GRPO, RLOO)
trl.GRPOTrainer(model=policy, reward_funcs=reward, ...)  # reward.monitor.run.alarms; PolicyMonitor.observe elsewhere
```

A snapshot runs under `torch.no_grad()`, without autocast, with every module in eval mode (each
module's own flag restored) and the torch RNG forked: training goes on exactly as without it. Each
snapshot wraps the model afresh: `RewardModel` keeps fp32 copies of the head and norm weights,
which go stale as soon as the optimiser steps. See docs/monitor.md.
"""

from ._monitor import Monitor as Monitor
from ._monitor import measure as measure
from ._monitor import untouched as untouched
from ._page import monitor_report as monitor_report
from ._policy import MonitoredReward as MonitoredReward
from ._policy import PolicyMonitor as PolicyMonitor
from ._policy import monitored_reward as monitored_reward
from ._policy_log import Alarm as Alarm
from ._policy_log import PolicyRecord as PolicyRecord
from ._policy_log import PolicyRun as PolicyRun
from ._surface import SURFACE as SURFACE
from ._trajectory import GROUPS as GROUPS
from ._trajectory import LENS_METRICS as LENS_METRICS
from ._trajectory import METRICS as METRICS
from ._trajectory import Snapshot as Snapshot
from ._trajectory import Trajectory as Trajectory

__all__ = ["GROUPS", "LENS_METRICS", "METRICS", "SURFACE", "Alarm", "Monitor", "MonitoredReward", "PolicyMonitor",
           "PolicyRecord", "PolicyRun", "Snapshot", "Trajectory", "measure", "monitor_report", "monitored_reward",
           "untouched"]


def __getattr__(name: str) -> type:
    # transformers' Trainer machinery is imported only when the callback is asked for.
    if name == "RewardLensCallback":
        from ._callback import callback_class

        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
