"""Probe scoring in fixed chunks of sequences, each kept as it finishes, so a run killed mid-probe resumes
without scoring a kept sequence again (`Chunks`: the audit keeps them in its results store).

A stage's new sequences are cut into chunks from the sequences alone (never from what is kept), in the order
the one-call read would take them: the plain loop's length order, in chunks of a whole number of its batches,
so every batch, and every number, is the one-call read's; through a `ReadCache` (shared with the concepts)
by token ids, so a prompt's variants meet in one chunk and share their prefix read (`read_sharing`). A chunk
is known by the token ids of its sequences in order (`chunk_unit`): found again only where it would be read
exactly so. Through a cache a chunk keeps every depth the cache holds ((L + 4) · d floats per sequence, as the
cache holds them in memory), and hands them back to the cache when read back: the concepts read nothing again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import UsageError
from ..model import ReadCache, RewardModel
from ..model.internal import Tokenized

SCORE_CHUNK = 64
"""Sequences per kept chunk (rounded up to whole batches): the most a killed run loses of its probe scoring."""

Load = Callable[[str], Mapping[str, Any] | None]
"""The record kept for a chunk's unit, None when none is (or it is damaged: it is scored again)."""
Save = Callable[[str, dict[str, Any]], None]
"""Keep a chunk's record under its unit (one transaction: all of it or nothing)."""


def chunk_unit(seqs: list[Tokenized]) -> str:
    """A chunk's name: a digest of its sequences' token ids (and token type ids), in order."""
    text = json.dumps([[s.ids, s.type_ids] for s in seqs]).encode()
    return hashlib.sha256(text).hexdigest()[:24]


class Chunks:
    """Where `probe(memo=)` keeps its scored sequences, chunk by chunk (`load`, `save`), and what one run did:
    `scored` sequences read by the model, `reused` read back (a progress bar counts both as done)."""

    def __init__(self, load: Load, save: Save, size: int = SCORE_CHUNK) -> None:
        if size < 1:
            raise UsageError(f"a chunk holds at least 1 sequence, got {size}")
        self.load, self.save, self.size = load, save, size
        self.scored = self.reused = 0

    def rewards(self, model: RewardModel, seqs: list[Tokenized], batch_size: int, step: Callable[[int], object],
                cache: ReadCache | None) -> np.ndarray:
        """The reward [n] of each of `seqs` (float32 values), chunk by chunk: a kept chunk read back (its depths
        handed to `cache`), the others read (`read_rewards`) and kept as each finishes; `step(n)` per chunk."""
        if cache is None:  # the one-call loop's order and batches (`RewardModel.batches`: stable by length)
            order = np.argsort([len(s.ids) for s in seqs], kind="stable").tolist()
        else:  # a prompt's variants together, so a chunk shares their prefix read
            order = sorted(range(len(seqs)), key=lambda i: (seqs[i].ids, seqs[i].type_ids or []))
        size = -(-self.size // batch_size) * batch_size
        reward = np.zeros(len(seqs), dtype=np.float32)
        for start in range(0, len(order), size):
            rows = order[start:start + size]
            part = [seqs[i] for i in rows]
            unit = chunk_unit(part)
            kept = self.load(unit)
            if kept is not None and len(kept["reward"]) == len(part) and (cache is None or "layers" in kept):
                if cache is not None:
                    cache.keep(part, kept)
                reward[rows] = kept["reward"]
                self.reused += len(part)
                step(len(part))
                continue
            got, depths = _read(model, part, batch_size, step, cache)
            self.save(unit, {"reward": got, **depths})
            reward[rows] = got
            self.scored += len(part)
        return reward


def read_rewards(model: RewardModel, seqs: list[Tokenized], batch_size: int, step: Callable[[int], object],
                 cache: ReadCache | None) -> np.ndarray:
    """The reward [n] (float32) of each sequence in one call: `model.score`'s loop (the same batches, fp32
    head and readout), or the read loop through `cache`; `step(n)` as each `n` are scored."""
    return _read(model, seqs, batch_size, step, cache)[0]


def _read(model: RewardModel, seqs: list[Tokenized], batch_size: int, step: Callable[[int], object],
          cache: ReadCache | None) -> tuple[np.ndarray, dict[str, Any]]:
    """`read_rewards`, and the cache's reading of `seqs` (`ReadCache.arrays`) when read through one, else {}."""
    if cache is not None:
        cache.check(model, "probe")
        reading = cache.read(seqs, batch_size=batch_size, step=step)
        return reading.reward.cpu().numpy().astype(np.float32), ReadCache.arrays(reading)
    reward = np.zeros(len(seqs), dtype=np.float32)
    for rows, batch in model.batches(seqs, batch_size):
        values, coef = model.head_readout(model.run(batch, model.final_points(batch)))
        reward[rows] = (values * coef).sum(-1).cpu().numpy()
        step(len(rows))
    return reward, {}


__all__ = ["SCORE_CHUNK", "Chunks", "chunk_unit", "read_rewards"]
