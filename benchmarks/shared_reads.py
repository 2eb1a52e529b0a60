"""The probes read with shared prefixes against the plain read loop, in interleaved rounds.

The audit scores the probe items (and the concepts' contrast sets, the same conversations) through one
`ReadCache`, which reads new sequences with `read_sharing` (model/_shared_reads.py): on a causal decoder an
item's variants share their prompt, so each family's prefix runs once and every variant continues it on
the model's cache. This times `probe(items, cache=ReadCache(model))` with that sharing and with every
sequence read by the plain loop (the sharing switched off), plain then shared each round, on the real
SmolLM2-135M RM (`rewardlens.zoo.realmodels`), and prints the ratio plain/shared as median [min, max]
over rounds (the machines are shared: a one-shot ratio swings by ±20 %), the tokens the families save,
and how far the two results' numbers are apart (float precision: the same statistics and flags).

    python benchmarks/shared_reads.py                       # 6 built-in items, 3 rounds, 1 thread: ~4 min
    python benchmarks/shared_reads.py --items 18 --rounds 5
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import Any

import numpy as np
import torch
from decompose import prepared

from rewardlens.hacking import probe, spread_items
from rewardlens.model import ReadCache
from rewardlens.model.internal import collate
from rewardlens.zoo.realmodels import load_reward_model

SHARED = importlib.import_module("rewardlens.model._shared_reads")


def plain(_model: Any, seqs: list[Any], _sink: Any, *, batch_size: int) -> list[int]:
    """`read_shared` switched off: every sequence is left to the plain loop."""
    return list(range(len(seqs)))


def timed_probe(model: Any, items: list[Any], shared: bool) -> tuple[float, Any, list[list[Any]]]:
    """(seconds, result, the sequences of each read call) of one probe run through a fresh cache, sharing
    on or off."""
    read: list[list[Any]] = []
    real = SHARED.read_sharing

    def counting(of: Any, seqs: list[Any], **kw: Any) -> Any:
        read.append(list(seqs))
        return real(of, seqs, **kw)

    cache_module = importlib.import_module("rewardlens.model._read_cache")
    saved, saved_read = SHARED.read_shared, cache_module.read_sharing
    SHARED.read_shared = saved if shared else plain
    cache_module.read_sharing = counting
    try:
        start = time.perf_counter()
        res = probe(model, items, cache=ReadCache(model), n_boot=200)
        return time.perf_counter() - start, res, read
    finally:
        SHARED.read_shared, cache_module.read_sharing = saved, saved_read


def saved_tokens(model: Any, calls: list[list[Any]]) -> tuple[int, int]:
    """(tokens read, prefix tokens families read once instead of once per member), family by family within
    each read call, as `read_shared` forms them (a family split across two calls is not shared)."""
    total = saved = 0
    for seqs in calls:
        reads = collate(seqs, pad_id=model.pad_token_id, side="right", first=False,
                        device=torch.device("cpu")).read_index.tolist()
        saved += sum((len(members) - 1) * p for p, members in SHARED.families(seqs, reads) if len(members) > 1)
        total += sum(len(s.ids) for s in seqs)
    return total, saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=6, help="built-in items, spread over the domains")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    prepared(args)
    model = load_reward_model("smollm2-dpo", device=args.device)
    items = spread_items(args.items)
    timed_probe(model, spread_items(2), True)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    results: dict[bool, Any] = {}
    calls: list[list[Any]] = []
    for _ in range(args.rounds):
        for shared in (False, True):
            seconds, results[shared], calls = timed_probe(model, items, shared)
            times[shared].append(seconds)
    total, saved = saved_tokens(model, calls)
    ratio = np.array(times[False]) / np.array(times[True])
    dtype = str(next(model.model.parameters()).dtype).removeprefix("torch.")
    print(f"SmolLM2-135M RM, {args.device} {dtype}, {args.threads} thread(s); probes on {args.items} built-in items: "
          f"{sum(map(len, calls))} sequences, {total} tokens, {saved} ({100 * saved / total:.0f} %) read once "
          "per family")
    print(f"plain read loop {np.median(times[False]):.2f} s, shared prefixes {np.median(times[True]):.2f} s: "
          f"plain/shared {np.median(ratio):.2f}x [{ratio.min():.2f}, {ratio.max():.2f}] over {args.rounds} rounds")
    a, b = results[False], results[True]
    print(f"same numbers: max |base reward diff| {np.abs(a.base_reward - b.base_reward).max():.1e}, "
          f"max |delta diff| {np.nanmax(np.abs(a.delta - b.delta)):.1e}; same flags: "
          f"{bool((a.flagged == b.flagged).all())}")


if __name__ == "__main__":
    main()
