"""bf16 audits with the calibrated continuation proof (`proof_tol`) granted against refused, interleaved.

In fp32 and fp64 a continuation's proof allows a relative gap of 1e-4. In bf16 it used to be refused
outright, so the shared-prefix reads, the trace's kept caches, the read token's backward and the suffix
sweep all ran their plain paths there, the headline's dtype among them. Now a bf16 or fp16 model is calibrated
once: it is granted an allowance where a continuation one position off misses by POWER times it.

This benchmark runs the real SmolLM2-135M RM (trained, so it sees positions: granted) in bf16 on held-out
pairs. Each round times:

- a plain unpadded forward of the pairs (the floor);
- the audit's per-pair part (`run_pairs`) and its probes and concepts (`run_whole` on `--probe-items`
  items, divergence off) with the proof **refused**, as before;
- the same with the proof **granted**.

Within each round it takes the ratio refused / granted, and prints the median [min, max] over the rounds
(the machines are shared, and a one-shot ratio swings by ±20 %). It also prints how far apart the two
arms' stored numbers are, relative to the largest: the gap is bf16 rounding, not float precision.

    python benchmarks/low_precision.py                          # CPU, 4 pairs, 3 rounds, 6 probe items
    python benchmarks/low_precision.py --device cuda --pairs 32 --rounds 5
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch

from audit import plain_forward, rounds
from rewardlens.audit import Plan, Store
from rewardlens.audit.internal import collect, run_pairs, run_whole
from rewardlens.model.internal import proof_tol
from rewardlens.zoo.realmodels import dpo_pairs, load_reward_model

CONTINUING = importlib.import_module("rewardlens.model._continuing")


@contextmanager
def refused(model: Any) -> Iterator[None]:
    """The proof refused for `model` in its dtype (every user then runs its plain path), as before the
    calibration; through the calibration's own per-model memo, so no user is patched."""
    dtype, granted = next(model.model.parameters()).dtype, proof_tol(model)  # calibrated first, to restore
    held = CONTINUING._CALIBRATED[model]
    held[dtype] = None
    try:
        yield
    finally:
        held[dtype] = granted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=400, help="use pairs whose sides are at most this long")
    ap.add_argument("--probe-items", type=int, default=6, help="built-in probe items (0: no probes nor concepts)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = load_reward_model("smollm2-dpo", device=args.device, dtype=getattr(torch, args.dtype))
    pairs = [p for p in dpo_pairs("test") if max(len(s.ids) for s in model.encode([p])[0]) <= args.max_tokens]
    pairs = pairs[: args.pairs]
    tol = proof_tol(model)
    print(f"SmolLM2-135M RM, {args.device} {args.dtype}, {args.threads} thread(s), {len(pairs)} pairs, "
          f"{args.probe_items} probe items, {args.rounds} interleaved rounds; proof allowance {tol}")
    if tol is None:
        raise SystemExit("the calibration refused this model's proof: nothing to compare")
    whole = args.probe_items > 0
    plan = Plan(chunk_size=max(len(pairs), 1), probe_items=args.probe_items or None, probes=whole,
                concepts=whole, divergence=False, tokens=False)
    stores: dict[str, Store] = {}
    audits: dict[str, Any] = {}

    def arm(name: str, part: str) -> Callable[[], None]:
        """One arm's part: the per-pair part into a fresh store, or the probes and concepts on that store."""
        def run() -> None:
            with refused(model) if name == "refused" else nullcontext():
                if part == "per-pair part":
                    stores[name] = Store(":memory:")
                    run_pairs(model, pairs, stores[name], plan)
                else:
                    run_whole(model, pairs, stores[name], plan)
                audits[name] = collect(model, pairs, stores[name], plan)
        return run

    arms = {"plain forward": plain_forward(model, pairs)}
    for part in ("per-pair part", *(["probes + concepts"] if whole else [])):
        for name in ("refused", "granted"):
            arms[f"{part}, {name}"] = arm(name, part)
    arms["plain forward"]()
    arms["per-pair part, granted"]()  # warm-up: lazy imports and the model's one-time checks
    times = rounds(arms, args.rounds, device)
    print(f"{'step':<32} {'median s':>9}   x plain forward")
    for name, t in times.items():
        r = np.array(t) / np.array(times["plain forward"])
        print(f"{name:<32} {np.median(t):9.2f}   {np.median(r):5.2f}x [{r.min():.2f}, {r.max():.2f}]")
    for part in ("per-pair part", *(["probes + concepts"] if whole else [])):
        r = np.array(times[f"{part}, refused"]) / np.array(times[f"{part}, granted"])
        print(f"{part}: refused / granted {np.median(r):.2f}x [{r.min():.2f}, {r.max():.2f}]")
    a, b = audits["refused"], audits["granted"]
    for name, x, y in (("lens rewards", a.lens.reward, b.lens.reward),
                       ("head attribution", a.heads.values, b.heads.values),
                       ("head patching effects", a.faithfulness.total, b.faithfulness.total)):
        x, y = np.asarray(x, float), np.asarray(y, float)
        print(f"{name}: largest gap between the arms {np.abs(x - y).max() / np.abs(x).max():.2e} of the largest")
    if whole:
        print(f"probe flags equal: {np.array_equal(a.probes.flagged, b.probes.flagged)}; largest probe-mean gap "
              f"{np.abs(a.probes.mean - b.probes.mean).max():.2e} (scale {a.probes.scale:.3f})")


if __name__ == "__main__":
    main()
