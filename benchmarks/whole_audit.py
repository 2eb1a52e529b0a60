"""The whole audit against its per-pair part, step by step, in interleaved rounds.

A default audit is its per-pair part (`run_pairs`: lens, attribution, faithfulness) plus the whole-model
part (`run_whole`: score parity on the first 8 pairs, token attribution, divergence, probes, concepts).
Issue 29's target: on the demo model with 40 pairs, the whole-model part at most 1.5x the per-pair part
(its steps then: parity came later, so the part is also printed without it). Parity, token attribution and
the probes and concepts cost the same whatever the pairs, so `--pairs` shows the ratio falling as the fixed part
is spread (README, "Where an audit's time goes"). Each round, in one process,
times a plain unpadded forward of the pairs (the floor), the per-pair part into a fresh in-memory store,
then each whole-model step alone (`run_whole` with a plan that asks for that step only, so the benchmark runs
exactly what the audit runs). Ratios are taken within a round and reported as median [min, max] over
rounds: the machines are shared, and a one-shot ratio swings by ±20 %.

    python benchmarks/whole_audit.py                    # demo model, 40 pairs, 5 rounds, 1 thread
    python benchmarks/whole_audit.py --pairs 16 --rounds 3 --probe-items 12
    python benchmarks/whole_audit.py --model smollm2-dpo --pairs 8 --rounds 3   # the real RM, held-out pairs

The demo model (2 layers, width 64) measures mostly per-call overhead; the real SmolLM2-135M RM
(`--model smollm2-dpo`, held-out dpo_en_demo pairs of at most 400 tokens a side) measures compute.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import torch
from audit_memory import make_pairs
from decompose import seconds

import rewardlens as rl
from audit import plain_forward
from rewardlens.audit import NaturalStates, Plan, Store
from rewardlens.audit.internal import run_pairs, run_whole
from rewardlens.zoo import demo_model_dir
from rewardlens.zoo.realmodels import NAMES, dpo_pairs, load_reward_model

FLAGS = ("tokens", "divergence", "probes", "concepts")
"""The whole-model steps of a default audit, each a `Plan` flag."""
STEPS = {"parity": (), "tokens": ("tokens",), "divergence": ("divergence",),
         "probes + concepts": ("probes", "concepts")}
"""What each timed step runs: parity (with every flag off: the audit always certifies its first 8 pairs'
scores, and a head with several outputs adds its conflicts), then each flag's step; the probes and concepts
run together, as in the audit, where they share one read of the sequences they both score (`ReadCache`)."""


def only(plan: Plan, step: str) -> Plan:
    """`plan` with every whole-model step off but those of `step`."""
    return replace(plan, **{flag: flag in STEPS[step] for flag in FLAGS})


def one_round(model: rl.RewardModel, pairs: list[rl.Pair], plan: Plan, device: torch.device) -> dict[str, float]:
    """Seconds of the floor, the per-pair part and each whole-model step, in that order, in one fresh store."""
    times = {"plain forward": seconds(plain_forward(model, pairs), device)}
    store, natural = Store(":memory:"), NaturalStates()  # as `audit` runs them: the residuals kept for divergence
    times["per-pair part"] = seconds(lambda: run_pairs(model, pairs, store, plan, natural=natural), device)
    for step in STEPS:  # in order, each stored once: parity first, so no later step's time holds it
        times[step] = seconds(lambda step=step: run_whole(model, pairs, store, only(plan, step), natural=natural),
                              device)
    store.close()
    return times


def load(name: str, n: int) -> tuple[rl.RewardModel, list[rl.Pair]]:
    """The model and `n` pairs: the demo model with the demo's audit pairs, or a real RM with its held-out
    pairs whose sides are at most 400 tokens (as benchmarks/audit.py takes them)."""
    if name == "demo":
        return rl.load(str(demo_model_dir())), make_pairs(n)
    model = load_reward_model(name)
    return model, [p for p in dpo_pairs("test") if max(len(s.ids) for s in model.encode([p])[0]) <= 400][:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--probe-items", type=int, default=None, help="built-in items for probes and concepts (all)")
    ap.add_argument("--model", choices=["demo", *NAMES], default="demo", help="the demo model or a real RM")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    model, pairs = load(args.model, args.pairs)
    plan = Plan(probe_items=args.probe_items)
    print(f"{args.model} model, {len(pairs)} pairs, {args.threads} thread(s), {args.rounds} interleaved rounds "
          f"(plus one warm-up), probe items: {args.probe_items or 'all'}")
    one_round(model, pairs[:4], plan, device)  # warm-up: caches, allocator, lazy imports
    rounds = [one_round(model, pairs, plan, device) for _ in range(args.rounds)]

    def ratio(name: str, over: str) -> str:
        r = np.array([t[name] / t[over] for t in rounds])
        return f"{np.median(r):6.2f}x [{r.min():.2f}, {r.max():.2f}]"

    for t in rounds:
        t["whole-model part"] = sum(t[s] for s in STEPS)
        t["... without parity"] = t["whole-model part"] - t["parity"]  # the steps issue 29 measured
    print(f"{'step':<20} {'median s':>9}   ratio to the per-pair part      ratio to the plain forward")
    for name in ("plain forward", "per-pair part", *STEPS, "whole-model part", "... without parity"):
        s = np.median([t[name] for t in rounds])
        print(f"{name:<20} {s:9.2f}   {ratio(name, 'per-pair part'):<31} {ratio(name, 'plain forward')}")
    print("target (issue 29): whole-model part <= 1.5x the per-pair part")


if __name__ == "__main__":
    main()
