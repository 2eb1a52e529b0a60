"""Peak memory (and time) of an audit's two halves next to a plain batched forward.

Each measurement runs in a fresh process (CPU, Linux: peak-RSS increase above what was held before
the call, with glibc made to unmap freed blocks, as in `benchmarks/decompose.py`; CUDA:
`max_memory_allocated`): a plain batched forward of the model's backbone on the audit's pairs
(`RewardModel.batches`, the audit's batch size), the audit's per-pair instruments (`run_pairs`:
lens, sublayer and head attribution, faithfulness) and its whole-model instruments (`run_whole`:
the probe suite and concepts over the built-in items) into an in-memory store. Prints each peak
above the weights, its ratio to the forward's, and the seconds each took. Aim: audit / forward <= 2.

    python benchmarks/audit_memory.py                        # the demo model, 40 pairs
    python benchmarks/audit_memory.py --model PATH --pairs 40 --probe-items 12
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import multiprocessing as mp
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

import rewardlens
from rewardlens import Pair, RewardModel
from rewardlens.audit import Plan, Store
from rewardlens.audit.internal import run_pairs, run_whole
from rewardlens.zoo import AUDIT_PAIRS, demo_model_dir

SUFFIXES = ("", " Please be brief.", " Explain your answer step by step.", " Answer as if to a beginner.")


def make_pairs(n: int) -> list[Pair]:
    """`n` pairs cycled from the demo's audit pairs, prompts varied so no two are the same."""
    out = []
    for i in range(n):
        p = AUDIT_PAIRS[i % len(AUDIT_PAIRS)]
        k = i // len(AUDIT_PAIRS)
        out.append(Pair(str(p.prompt) + SUFFIXES[k % len(SUFFIXES)] + " " * (k // len(SUFFIXES)), p.chosen, p.rejected))
    return out


def cpu_reset() -> Callable[[], None]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: large blocks are mapped alone and unmapped when freed
    libc.mallopt(-1, 64 * 1024)  # M_TRIM_THRESHOLD

    def reset() -> None:
        gc.collect()
        libc.malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    return reset


def measure(what: str, path: str, n_pairs: int, probe_items: int | None, device: str, queue: mp.Queue) -> None:
    """In a fresh process: (peak bytes above what was held before, seconds, weight bytes) of one call."""
    reset = cpu_reset() if device == "cpu" else None
    model = rewardlens.load(path, device=device)
    with torch.no_grad():  # copy CPU weights off their mmap: reclaimable clean pages add noise to RSS
        for t in [*model.model.parameters(), *model.model.buffers()]:
            t.data = t.data.clone()
    weights = sum(t.numel() * t.element_size() for t in model.model.parameters())
    pairs, plan = make_pairs(n_pairs), Plan(probe_items=probe_items)
    calls: dict[str, Callable[[], object]] = {
        "forward": lambda: forward(model, pairs, plan.batch_size),
        "per-pair": lambda: run_pairs(model, pairs, Store(":memory:"), plan),
        "whole-model": lambda: run_whole(model, pairs, Store(":memory:"), plan),
    }
    start = time.perf_counter()
    if device == "cpu":
        assert reset is not None
        kib = lambda field: int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text())[1])  # noqa: E731
        reset()
        base = kib("VmRSS")
        start = time.perf_counter()
        calls[what]()
        peak = (kib("VmHWM") - base) * 1024
    else:
        dev = torch.device(device)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        start = time.perf_counter()
        calls[what]()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - base
    queue.put((peak, time.perf_counter() - start, weights))


def forward(model: RewardModel, pairs: list[Pair], batch_size: int) -> None:
    """The plain batched forward: the backbone on the audit's padded batches, nothing captured."""
    with torch.no_grad():
        for _, batch in model.batches(model.encode(pairs)[0], batch_size):
            model.backbone(**model.batch_kwargs(batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a reward-model folder (default: the demo model)")
    parser.add_argument("--pairs", type=int, default=40, help="number of pairs (default 40)")
    parser.add_argument("--probe-items", type=int, default=None, help="built-in items for probes and concepts")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", choices=("forward", "per-pair", "whole-model"), action="append")
    args = parser.parse_args()
    path = args.model or str(demo_model_dir())
    ctx = mp.get_context("spawn")
    rows = {}
    for what in args.only or ("forward", "per-pair", "whole-model"):
        queue: mp.Queue = ctx.Queue()
        proc = ctx.Process(target=measure, args=(what, path, args.pairs, args.probe_items, args.device, queue))
        proc.start()
        rows[what] = queue.get()
        proc.join()
    weights = next(iter(rows.values()))[2]
    print(f"model {path}: weights {weights / 2**20:.1f} MiB; {args.pairs} pairs on {args.device}")
    fwd = rows.get("forward", (float("nan"), 0, 0))[0]
    for what, (peak, seconds, _) in rows.items():
        print(f"  {what:<12} peak above weights {peak / 2**20:9.1f} MiB   x{peak / fwd:6.2f} of forward   "
              f"{seconds:7.1f} s")


if __name__ == "__main__":
    main()
