"""Divergence-scored head patching: the cached read-position engine against the copy engine, interleaved.

The audit's divergence step is `patch(level="head", divergence=True)` over every pair, so it grows with
the pairs as the per-pair part does. Divergence needs each patched run's residual after every layer at
the read token. The copy engine (`causal/_engine.read_sweep`) runs every patched copy of the read token
through every layer, with the prefix recomputed alongside; the cached engine (`causal/_cached.py`)
starts each copy at its own layer on the prefix's cache and takes the residuals below it from the clean
run. Each round times both on the same pairs, copy engine first, and the ratio copy/cached is printed as
median [min, max] over rounds (the machines are shared: a one-shot ratio swings by ±20 %), with how far
the two results' numbers are apart (float precision).

    python benchmarks/divergence.py                                     # demo model, 40 pairs, 5 rounds
    python benchmarks/divergence.py --model smollm2-dpo --pairs 4 --rounds 3   # the real RM: ~4 min

`--step` times what divergence adds to an audit instead, before and after the audit scored faithfulness's
own sweep (issue 43): before, every chunk traced and patched a second time against the fit (`_divergence._alone`,
what a stored pair without scores still gets); now, the fit's head-less trace of every pair, chunk by chunk
(`NaturalStates.trace`), the sweep faithfulness runs anyway being scored in place (no second sweep).

    python benchmarks/divergence.py --model smollm2-dpo --pairs 8 --rounds 3 --step   # ~6 min
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import Any

import numpy as np
import torch
from whole_audit import load

from rewardlens.audit import Plan
from rewardlens.causal import Patching, patch, patch_mode
from rewardlens.causal.internal import encode_pairs
from rewardlens.zoo.realmodels import NAMES

DIV = importlib.import_module("rewardlens.audit._divergence")
NATURAL = importlib.import_module("rewardlens.audit._natural")


def timed(model: Any, pairs: list[Any], cached: bool) -> tuple[float, Patching]:
    """(seconds, result) of the audit's divergence call, the cached engine on or off (then the copy engine)."""
    start = time.perf_counter()
    res = patch(model, pairs, level="head", divergence=True, engine=None if cached else "read_sweep")
    return time.perf_counter() - start, res


def step(model: Any, pairs: list[Any], rounds: int) -> None:
    """What divergence adds to the audit: a second scored sweep per chunk (before) against the fit's trace (now)."""
    plan = Plan()
    units, seqs = [str(i) for i in range(len(pairs))], encode_pairs(model, pairs)
    mode = patch_mode(model, pairs, seqs)
    spans = [range(s, min(s + plan.chunk_size, len(pairs))) for s in range(0, len(pairs), plan.chunk_size)]

    def fitted() -> Any:
        states = NATURAL.NaturalStates()
        for span in spans:
            states.trace(model, seqs[2 * span.start: 2 * span.stop], units[span.start: span.stop], plan.batch_size)
        return states.fit(model, seqs, units, plan.batch_size)

    fit, times = fitted(), []
    for _ in range(rounds):
        start = time.perf_counter()
        Patching.joined([DIV._alone(model, pairs[span.start: span.stop], seqs[2 * span.start: 2 * span.stop], fit,
                                    mode, plan) for span in spans], pairs)
        t_before = time.perf_counter() - start
        start = time.perf_counter()
        fitted()
        times.append((t_before, time.perf_counter() - start))
    before, after = np.array(times).T
    r = before / after
    print(f"{'second scored sweep':<26}{np.median(before):8.2f} s")
    print(f"{'the fit only':<26}{np.median(after):8.2f} s")
    print(f"before / after {np.median(r):6.2f}x [{r.min():.2f}, {r.max():.2f}]")


def report(runs: list[tuple[float, float, Patching, Patching]], names: tuple[str, str, str]) -> None:
    """Median seconds of each side, their ratio as median [min, max] over rounds, and the largest gap."""
    a_s, b_s = np.array([r[0] for r in runs]), np.array([r[1] for r in runs])
    gaps = [max(float(np.abs(a.divergence - b.divergence).max()),
                float(np.abs(a.patched_chosen - b.patched_chosen).max()))
            for _, _, a, b in runs if a.divergence is not None and b.divergence is not None]
    r = a_s / b_s
    print(f"{names[0]:<26}{np.median(a_s):8.2f} s")
    print(f"{names[1]:<26}{np.median(b_s):8.2f} s")
    print(f"{names[2]} {np.median(r):6.2f}x [{r.min():.2f}, {r.max():.2f}]")
    print(f"largest |difference| (divergence, patched rewards): {max(gaps):.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", choices=["demo", *NAMES], default="demo", help="the demo model or a real RM")
    ap.add_argument("--step", action="store_true", help="time the audit's divergence step, before and after")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, pairs = load(args.model, args.pairs)
    print(f"{args.model} model, {len(pairs)} pairs, {len(model.encode(pairs)[0])} sequences, {args.threads} "
          f"thread(s), {args.rounds} interleaved rounds (plus one warm-up)")
    if args.step:
        step(model, pairs[:4] * 2, 1)  # warm-up
        return step(model, pairs, args.rounds)
    for cached in (True, False):  # warm-up: 8 pairs, enough to calibrate
        timed(model, pairs[:4] * 2, cached)
    runs = []
    for _ in range(args.rounds):
        t_copy, slow = timed(model, pairs, False)
        t_cached, fast = timed(model, pairs, True)
        runs.append((t_copy, t_cached, slow, fast))
    report(runs, ("copy engine", "cached engine", "copy / cached"))


if __name__ == "__main__":
    main()
