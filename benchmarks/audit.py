"""The audit's per-pair instruments on a real reward model, as a ratio to one plain forward.

The real SmolLM2-135M reward model (`rewardlens.zoo.realmodels`, trained head) on held-out
dpo_en_demo pairs. The yardstick is one *unpadded* plain forward of every sequence (each side
alone, no hooks): what any reward model pays to score the pairs. Then, in the same run:

- `audit`: the audit's whole per-pair computation (`run_pairs` into an in-memory store: lens,
  sublayer and head attribution, the faithfulness report at head level), the number the target
  is about (<= 5x);
- each instrument alone as a user calls it (`score`, `lens`, `attribute` at both levels,
  `patch` total and direct at head level, `attribution_patch`, `faithfulness`), for the breakdown;
- peak memory (CPU: peak-RSS increase of the call above what was held before, as in
  benchmarks/decompose.py; CUDA: max_memory_allocated) of the audit and of a plain padded
  batched forward, above the weights.

It also checks that the audit's stored numbers equal the instruments' own to float precision.

    python benchmarks/audit.py                      # CPU, one thread, 4 pairs of <= 400 tokens: ~3 min
    python benchmarks/audit.py --pairs 8 --threads 2
    python benchmarks/audit.py --device cuda --dtype bfloat16 --pairs 32
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
from decompose import cpu_memory_mode, peak_bytes, seconds

import rewardlens as rl
from rewardlens.audit import Plan, Store, collect, run_pairs
from rewardlens.zoo.realmodels import dpo_pairs, load_reward_model


def plain_forward(model: rl.RewardModel, pairs: list[rl.Pair]) -> Callable[[], None]:
    """One unpadded no-hook forward of every sequence: the cost of scoring the pairs at all."""
    seqs, _ = model.encode(pairs)
    ids = [torch.tensor([s.ids], device=model.device) for s in seqs]

    def run() -> None:
        with torch.no_grad():
            for x in ids:
                model.model(input_ids=x)
    return run


def padded_forward(model: rl.RewardModel, pairs: list[rl.Pair], batch_size: int) -> Callable[[], None]:
    """A plain batched forward through the read loop's own batches (padding included)."""
    seqs, is_pairs = model.encode(pairs)

    def run() -> None:
        with torch.no_grad():
            for _, batch in model.batches(seqs, batch_size, "right", is_pairs):
                model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4, help="held-out pairs to audit")
    ap.add_argument("--max-tokens", type=int, default=400, help="use pairs whose sides are at most this long")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--skip-breakdown", action="store_true", help="time only the forward and the audit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reset = cpu_memory_mode() if args.device == "cpu" else None
    device = torch.device(args.device)
    model = load_reward_model("smollm2-dpo", device=args.device, dtype=getattr(torch, args.dtype))
    pairs = [p for p in dpo_pairs("test") if max(map(len, (s.ids for s in model.encode([p])[0]))) <= args.max_tokens]
    pairs = pairs[: args.pairs]
    lengths = [len(s.ids) for s in model.encode(pairs)[0]]
    print(f"model: SmolLM2-135M reward model ({model.n_layers} layers, {model.n_heads} heads), {args.device} "
          f"{args.dtype}, {args.threads} thread(s); {len(pairs)} pairs, {min(lengths)}-{max(lengths)} tokens a side")
    bs = args.batch_size
    plan = Plan(chunk_size=max(len(pairs), 1), batch_size=bs, probes=False, concepts=False)
    forward = plain_forward(model, pairs)
    forward()  # warm-up: first-call allocations are not the forward's cost
    base = seconds(forward, device)
    print(f"plain unpadded forward of {2 * len(pairs)} sequences: {base:.2f} s")

    stored: dict[str, object] = {}

    def audit_once() -> None:
        store = Store(":memory:")
        run_pairs(model, pairs, store, plan)
        stored["audit"] = collect(model, pairs, store, plan)
        store.close()
    t_audit = seconds(audit_once, device)
    print(f"\naudit per-pair instruments: {t_audit:.2f} s = {t_audit / base:.2f}x a plain forward (target <= 5x)")
    if not args.skip_breakdown:
        calls: dict[str, Callable[[], object]] = {
            "score": lambda: model.score(pairs, batch_size=bs),
            "lens": lambda: rl.lens(model, pairs, batch_size=bs),
            "attribute sublayer": lambda: rl.attribute(model, pairs, batch_size=bs),
            "attribute head": lambda: rl.attribute(model, pairs, level="head", batch_size=bs),
            "patch head total": lambda: rl.patch(model, pairs, level="head", batch_size=bs),
            "patch head direct": lambda: rl.patch(model, pairs, level="head", estimand="direct", batch_size=bs),
            "attribution_patch head": lambda: rl.attribution_patch(model, pairs, level="head", batch_size=bs),
            "faithfulness head": lambda: rl.faithfulness(model, pairs, level="head", batch_size=bs),
        }
        print("breakdown (each instrument called alone):")
        results = {}
        for name, fn in calls.items():
            t = seconds(lambda: results.__setitem__(name, fn()), device)  # noqa: B023
            print(f"  {name:24s} {t:7.2f} s  {t / base:5.2f}x")
        audit = stored["audit"]
        assert isinstance(audit, rl.Audit)
        heads = results["attribute head"]
        assert isinstance(heads, rl.Attribution)
        faith = results["faithfulness head"]
        assert isinstance(faith, rl.Faithfulness)
        diff = lambda a, b: float(np.abs(a - b).max())  # noqa: E731
        f = audit.faithfulness
        print(f"same numbers: head attribution max |diff| {diff(audit.heads.values, heads.values):.2e}, "
              f"total effect {diff(f.total, faith.total):.2e}, "
              f"attribution patching {diff(f.attribution_patching, faith.attribution_patching):.2e}")
    weights = sum(p.numel() * p.element_size() for p in model.model.parameters())
    padded = peak_bytes(padded_forward(model, pairs, bs), device, reset)
    peak = peak_bytes(audit_once, device, reset)
    print(f"\npeak memory above the weights ({weights / 2**20:.0f} MiB): plain batched forward "
          f"{padded / 2**20:.0f} MiB, audit {peak / 2**20:.0f} MiB = {peak / max(padded, 1):.1f}x (aim <= 2x)")


if __name__ == "__main__":
    main()
