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

The forward and the audit are timed in `--rounds` interleaved rounds (default 5), each ratio taken
within its round and reported as median [min, max]: the machines are shared, and a one-shot ratio
swings by ±20 %. Each round also times `unshared`, the audit with attribution patching recording
its targets in a forward of its own (as before issue 29, item 4) instead of reusing the trace's
recording (`trace_pairs(record=)`), so the saving is measured side by side.

It also checks that the audit's stored numbers equal the instruments' own to float precision.

    python benchmarks/audit.py                      # CPU, one thread, 4 pairs of <= 400 tokens, 5 rounds
    python benchmarks/audit.py --pairs 8 --threads 2 --skip-breakdown
    python benchmarks/audit.py --device cuda --dtype bfloat16 --pairs 32
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
import torch
from decompose import cpu_memory_mode, peak_bytes, seconds

import rewardlens as rl
from rewardlens.audit import Plan, Store
from rewardlens.audit.internal import collect, run_pairs
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


RUNNER = importlib.import_module("rewardlens.audit._runner")


@contextmanager
def unshared() -> Iterator[None]:
    """The audit's chunk traces without recording (`record=` dropped): attribution patching's backward
    then records its targets with a forward of its own, the path before the trace's recording was reused."""
    real = RUNNER.trace_pairs

    def trace(*args: object, record: object = None, **kwargs: object) -> object:
        return real(*args, **kwargs)
    with mock.patch.object(RUNNER, "trace_pairs", trace):
        yield


def rounds(arms: dict[str, Callable[[], None]], n: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds of each arm in `n` rounds, the arms run one after another within a round."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(n):
        for name, fn in arms.items():
            times[name].append(seconds(fn, device))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4, help="held-out pairs to audit")
    ap.add_argument("--max-tokens", type=int, default=400, help="use pairs whose sides are at most this long")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--skip-breakdown", action="store_true", help="time only the forward and the audit")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of forward, audit and unshared")
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

    stored: dict[str, object] = {}

    def audit_once(key: str = "audit") -> None:
        store = Store(":memory:")
        run_pairs(model, pairs, store, plan)
        stored[key] = collect(model, pairs, store, plan)
        store.close()

    def audit_unshared() -> None:
        with unshared():
            audit_once("unshared")
    audit_once()  # warm-up (lazy imports, the model's one-time checks)
    times = rounds({"forward": forward, "audit": audit_once, "unshared": audit_unshared}, args.rounds, device)
    base = float(np.median(times["forward"]))
    print(f"plain unpadded forward of {2 * len(pairs)} sequences: {base:.2f} s (median of {args.rounds} rounds)")
    print("\naudit per-pair instruments, as a multiple of the plain forward of the same round, median [min, max]:")
    for name, label in (("audit", "audit (trace's recording reused)"), ("unshared", "unshared (recorded again)")):
        r = np.array(times[name]) / np.array(times["forward"])
        print(f"  {label:34s} {np.median(times[name]):7.2f} s  {np.median(r):5.2f}x [{r.min():.2f}, {r.max():.2f}]")
    saved = 1 - np.array(times["audit"]) / np.array(times["unshared"])
    print(f"  saved by the shared recording: {100 * np.median(saved):.1f} % [{100 * saved.min():.1f}, "
          f"{100 * saved.max():.1f}] (target: audit <= 3.5x)")
    shared_run, unshared_run = stored["audit"], stored["unshared"]
    assert isinstance(shared_run, rl.Audit) and isinstance(unshared_run, rl.Audit)
    gap = np.abs(shared_run.faithfulness.attribution_patching - unshared_run.faithfulness.attribution_patching).max()
    print(f"  same estimates: attribution patching max |shared - unshared| {float(gap):.2e}")
    if not args.skip_breakdown:
        calls: dict[str, Callable[[], object]] = {
            "score": lambda: model.score(pairs, batch_size=bs),
            "lens": lambda: rl.lens(model, pairs, batch_size=bs),
            "attribute sublayer": lambda: rl.attribute(model, pairs, batch_size=bs),
            "attribute head": lambda: rl.attribute(model, pairs, level="head", batch_size=bs),
            "patch head total": lambda: rl.patch(model, pairs, level="head", batch_size=bs),
            "patch head direct": lambda: rl.patch(model, pairs, level="head", estimand="direct", batch_size=bs),
            "attribution_patch head": lambda: rl.causal.attribution_patch(model, pairs, level="head", batch_size=bs),
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
    peak_unshared = peak_bytes(audit_unshared, device, reset)
    print(f"\npeak memory above the weights ({weights / 2**20:.0f} MiB): plain batched forward "
          f"{padded / 2**20:.0f} MiB, audit {peak / 2**20:.0f} MiB = {peak / max(padded, 1):.1f}x (aim <= 2x); "
          f"unshared {peak_unshared / 2**20:.0f} MiB = {peak_unshared / max(padded, 1):.1f}x")


if __name__ == "__main__":
    main()
