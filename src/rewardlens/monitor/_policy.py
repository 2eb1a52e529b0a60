"""Watch a policy being optimised against a reward model: a reward function that monitors itself.

```python
reward = monitored_reward(rm, log="run/policy.jsonl")    # rm: rewardlens.load(...) or a HF model + tokenizer
trainer = trl.GRPOTrainer(model=policy, reward_funcs=reward, ...)   # RLOO, online DPO: the same signature
reward.monitor.run.alarms     # e.g. "reward gain since step 1 is 58% keyword direction (95% CI 58%–59%, ...)"
mon = PolicyMonitor(rm, log=...); mon.observe(prompts, completions, step)   # any PPO loop (OpenRLHF, verl, ...)
```

Each batch is scored by one `RewardModel.read` (the reward `model.score` gives, to the bit) whose
head input `ĥ` and effective read-out `u` give, at no extra forward, the reward's exact split along
the bias directions (`_gain`). Every `parts_every` batches an exact sublayer attribution (one more
traced forward on that batch only) says which parts write the reward now against the first batch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..errors import DataError, UsageError
from ..exact import attribute
from ..hacking import AXES, Concepts, ConceptSets, concepts, contrast_sets
from ..model import RewardModel, wrap
from ..types import Conversation, Text
from ._gain import gain_shares, rank_correlations, split_reward
from ._policy_log import Alarm, PolicyRecord, PolicyRun, top_moved
from ._surface import SURFACE, surface

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Directions = Concepts | Mapping[str, Any] | None


def _content(message: Any) -> str:
    return str(message["content"]) if isinstance(message, Mapping) else str(message)


def conversations(prompts: Sequence[Any], completions: Sequence[Any]) -> tuple[list[Conversation], list[str]]:
    """(chat conversations the reward model reads, completion texts) from TRL's two formats: plain
    strings (the prompt becomes one user turn, the completion the assistant's reply, as a
    `rewardlens.Pair` is read) or conversational lists of messages (prompt messages + completion
    messages, as TRL builds them)."""
    if len(prompts) != len(completions):
        raise DataError(f"got {len(prompts)} prompts and {len(completions)} completions; a reward function "
                        "scores one completion per prompt (repeat each prompt once per generation)")
    convs: list[Conversation] = []
    texts: list[str] = []
    for p, c in zip(prompts, completions):
        turns = [dict(m) for m in p] if isinstance(p, list) else [{"role": "user", "content": str(p)}]
        reply = [dict(m) for m in c] if isinstance(c, list) else [{"role": "assistant", "content": str(c)}]
        convs.append(turns + reply)
        texts.append("\n".join(_content(m) for m in reply))
    return convs, texts


def _unit_directions(rm: RewardModel, directions: Directions, axes: Sequence[str] | None,
                     batch_size: int, progress: bool) -> tuple[tuple[str, ...], torch.Tensor]:
    """Names and unit directions [m, d] in head space (what the head reads at t*)."""
    if directions is None:
        chosen = list(dict.fromkeys(SURFACE[s][0] for s in SURFACE)) if axes is None else list(axes)
        unknown = [a for a in chosen if a not in AXES]
        if unknown:
            raise UsageError(f"unknown probe axes {unknown}; choose from {list(AXES)}")
        sets: ConceptSets = {a: contrast_sets(a) for a in chosen}
        # Only the last layer's head-space directions are used; the dose is the cheapest one allowed.
        directions = concepts(rm, sets, layers=[-1], alphas=(0.0, 1.0), n_boot=1, batch_size=batch_size,
                              progress=progress)
    if isinstance(directions, Concepts):
        names = directions.names
        vecs = np.stack([directions.direction(n, -1, "head") for n in names])
    else:
        names = tuple(str(n) for n in directions)
        vecs = np.stack([np.asarray(v, dtype=np.float64).reshape(-1) for v in directions.values()])
    if vecs.ndim != 2 or vecs.shape[1] != rm.d_model:
        raise UsageError(f"bias directions must be vectors of the head's input width {rm.d_model}, got shape "
                         f"{vecs.shape}; pass {{name: vector}} in the space the head reads (final norm output)")
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise UsageError(f"bias direction(s) {[n for n, z in zip(names, norms[:, 0] == 0) if z]} are zero vectors")
    return tuple(names), torch.as_tensor(vecs / norms, dtype=torch.float32)


class PolicyMonitor:
    """Scores a policy's samples with a reward model and records, per batch, where the reward comes from.

    `model`: a `RewardModel` (`rewardlens.load`) or a Hugging Face model with `tokenizer` (wrapped
    once; the reward model does not train). `directions`: the bias directions, in the head's input
    space: None (the concept directions of the probe `axes` — by default the five the surface
    statistics observe: length, formatting, emoji, sycophancy, markdown — from
    `rewardlens.hacking.concepts`), a `Concepts` result, or {name: vector [d]}. `stats`: surface
    statistics (`SURFACE`). The first `baseline` batches are the reference; each later batch
    compares the last `window` batches with them. Alarms: a direction whose share of the reward
    gain has its 95% interval above `share_threshold` while the gain's interval is above
    `min_gain` × the baseline rewards' sd; a statistic whose Spearman ρ with reward over the window
    has its interval above `rho_threshold`. `parts_every`: exact sublayer attribution on every
    `parts_every`-th batch (0: never), `top` parts kept. `log`: a JSON-lines file each record is
    appended to, flushed and synced (a crash loses nothing). `progress`: a bar on stderr while the
    set-up builds the concept directions (minutes on a real RM; on by default, so it is never silent);
    scoring the policy's batches shows none.
    """

    def __init__(
        self, model: RewardModel | nn.Module, tokenizer: PreTrainedTokenizerBase | None = None, *,
        directions: Directions = None, axes: Sequence[str] | None = None, stats: Sequence[str] = tuple(SURFACE),
        baseline: int = 2, window: int = 4, share_threshold: float = 0.5, rho_threshold: float = 0.5,
        min_gain: float = 0.5, parts_every: int = 10, top: int = 5, log: str | os.PathLike[str] | None = None,
        batch_size: int = 16, n_boot: int = 1000, seed: int = 0, progress: bool = True, **wrap_kwargs: Any,
    ) -> None:
        if baseline < 1 or window < 1:
            raise UsageError(f"baseline and window must be at least one batch, got {baseline} and {window}")
        if isinstance(model, RewardModel):
            self.rm = model
        elif tokenizer is None:
            raise UsageError("a Hugging Face model needs its tokenizer: PolicyMonitor(model, tokenizer) — or pass "
                             "the RewardModel rewardlens.load gives")
        else:
            self.rm = wrap(model, tokenizer, **wrap_kwargs)
        surface([], [], stats)  # refuses unknown names now, not at the first batch
        self.stats, self.baseline, self.window = tuple(stats), baseline, window
        self.share_threshold, self.rho_threshold, self.min_gain = share_threshold, rho_threshold, min_gain
        self.parts_every, self.top, self.batch_size, self.n_boot, self.seed = parts_every, top, batch_size, n_boot, seed
        self.log = None if log is None else Path(log)
        self.directions, self._vectors = _unit_directions(self.rm, directions, axes, batch_size, progress)
        self.records: list[PolicyRecord] = []
        self._first_parts: dict[str, float] | None = None

    @property
    def run(self) -> PolicyRun:
        """Every record so far."""
        return PolicyRun(tuple(self.records))

    def observe(self, prompts: Sequence[Any], completions: Sequence[Any], step: int) -> PolicyRecord:
        """Score one batch (`prompts`, `completions`: strings or TRL's conversational messages),
        record it, append it to the log and return it; `record.rewards` are the rewards."""
        convs, texts = conversations(prompts, completions)
        seqs, _ = self.rm.encode(convs)
        reading = self.rm.read(seqs, batch_size=self.batch_size, readout=True)
        assert reading.readout is not None  # asked for
        return self.observe_read(convs, texts, reading.reward, reading.hidden, reading.readout, step)

    def observe_read(self, convs: Sequence[Text], texts: Sequence[str], reward: torch.Tensor, hidden: torch.Tensor,
                     readout: torch.Tensor, step: int, n_tokens: Sequence[int] | None = None) -> PolicyRecord:
        """`observe` for a batch already read elsewhere (a reward server's batched forward): `convs` what the
        model read, `texts` the completions, and the read's `reward` [n], head input `hidden` [n, d] and
        effective read-out `readout` [n, d] (`RewardModel.read(..., readout=True)`), rows in `convs` order.
        `n_tokens`: each completion's length in the reward model's tokens, when the caller has counted them;
        with it, the reward model is used only when `parts_due` (another thread may be using it meanwhile)."""
        texts = list(texts)
        along, rest, constant = split_reward(hidden, readout, reward, self._vectors.to(hidden.device))
        if n_tokens is None:
            n_tokens = self.completion_tokens(texts)
        record = PolicyRecord(int(step), reward.cpu().double().numpy(), self.directions, along, rest,
                              constant, self.stats, surface(texts, list(n_tokens), self.stats))
        record = self._summarise(record, list(convs))
        self.records.append(record)
        self._write(record)
        return record

    def completion_tokens(self, texts: Sequence[str]) -> list[int]:
        """Each completion's length in the reward model's tokens (the `length` statistic)."""
        return [len(self.rm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]

    @property
    def parts_due(self) -> bool:
        """Whether the next record runs the exact sublayer attribution (a traced forward of the reward model)."""
        return bool(self.parts_every) and len(self.records) % self.parts_every == 0

    def _summarise(self, rec: PolicyRecord, convs: list[Text]) -> PolicyRecord:
        """The record with the gain's split, the window's rank correlations, the parts and the alarms."""
        history = [*self.records, rec]
        extra: dict[str, Any] = {}
        if self.parts_due:
            att = attribute(self.rm, convs, level="sublayer", batch_size=self.batch_size, per_objective=False)
            parts = {n: float(v) for n, v in zip(att.names, att.values.mean(0))}
            self._first_parts = self._first_parts or parts
            extra.update(parts=parts, top=top_moved(parts, self._first_parts, self.top))
        # While the baseline fills, the window is the batches so far (ρ is defined, the gain is not).
        window = history[max(self.baseline, len(history) - self.window):] if len(history) > self.baseline else history
        y = np.concatenate([r.rewards for r in window])
        stat = np.concatenate([r.surface for r in window])
        rhos = rank_correlations(stat, y, n_boot=self.n_boot, seed=self.seed)
        extra.update(rho=np.array([r[0] for r in rhos]), rho_ci=np.array([r[1:] for r in rhos]).reshape(-1, 2))
        if len(history) > self.baseline:
            base = history[: self.baseline]
            terms = lambda rs: np.concatenate([np.column_stack([r.along, r.rest, r.constant]) for r in rs])  # noqa: E731
            g = gain_shares(terms(base), terms(window), n_boot=self.n_boot, seed=self.seed)
            extra.update(since=base[-1].step, gain=g.total, gain_ci=g.total_ci, share=g.share, share_ci=g.share_ci)
        rec = replace(rec, **extra)
        return replace(rec, alarms=self._alarms(rec, np.concatenate([r.rewards for r in history[: self.baseline]])))

    def _alarms(self, rec: PolicyRecord, base_rewards: np.ndarray) -> tuple[Alarm, ...]:
        out = []
        floor = self.min_gain * float(np.std(base_rewards)) if len(base_rewards) > 1 else 0.0
        if len(rec.share) and np.isfinite(rec.gain_ci[0]) and rec.gain_ci[0] > floor:
            for j, name in enumerate(rec.directions):
                lo, hi = rec.share_ci[j]
                if np.isfinite(lo) and lo > self.share_threshold:
                    out.append(Alarm("direction", name, name if name in AXES else None, rec.step, rec.since,
                                     float(rec.share[j]), (float(lo), float(hi)), self.share_threshold))
        for s, name in enumerate(rec.stats):
            lo, hi = rec.rho_ci[s]
            if np.isfinite(lo) and lo > self.rho_threshold:
                out.append(Alarm("surface", name, SURFACE[name][0], rec.step, rec.since, float(rec.rho[s]),
                                 (float(lo), float(hi)), self.rho_threshold))
        return tuple(out)

    def _write(self, record: PolicyRecord) -> None:
        if self.log is None:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as f:  # flushed and synced per record: a crash loses nothing
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())


class MonitoredReward:
    """A reward function with TRL's signature (`prompts`, `completions`, `**kwargs` → list of floats)
    that scores through a `PolicyMonitor` (`.monitor`). The step is TRL's `trainer_state.global_step`
    when the trainer passes it (else the number of batches scored so far); each record's `metrics`
    go to TRL's `log_metric` when it is passed, so `Trainer.log` (and W&B, TensorBoard) shows them."""

    __name__ = "rewardlens"  # what TRL names the reward in its logs (rewards/rewardlens/mean)

    def __init__(self, monitor: PolicyMonitor) -> None:
        self.monitor = monitor

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        state = kwargs.get("trainer_state")
        step = int(state.global_step) if state is not None else len(self.monitor.records)
        record = self.monitor.observe(prompts, completions, step)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for name, value in record.metrics.items():
                log_metric(name, value)
        return [float(r) for r in record.rewards]


def monitored_reward(model: RewardModel | nn.Module, tokenizer: PreTrainedTokenizerBase | None = None,
                     **options: Any) -> MonitoredReward:
    """A TRL reward function (GRPO, RLOO, online DPO) scoring with `model` and monitoring every
    batch; `options` are `PolicyMonitor`'s (`directions=`, `log=`, thresholds, ...)."""
    return MonitoredReward(PolicyMonitor(model, tokenizer, **options))
