"""Patching sweeps against the naive loop, at 8B-reward-model depth.

A random-init Llama reward model with the 32 layers of the 8B reward models (hidden 128, 8 heads,
to fit these CPUs) is saved with the demo tokenizer and loaded by `rewardlens.load`. On 16
token-aligned pairs of 60-130 tokens (the rejected side changes a few numbers, so whole-sequence
patching applies) it times, in one run:

- the read-position sublayer sweep `patch(level="sublayer")` (65 parts),
- the read-position head sweep `patch(level="head")` (256 heads + 32 MLPs + embeddings),
- the whole-sequence sublayer sweep `patch(positions="all")`,

each against the naive loop, which pays one clean and one source forward per pair plus one full
unpadded forward per part, with a hook that inserts the source activation. Ratios are naive time
over engine time (targets: >= 20x, >= 50x, >= 1.5x). It also checks that both give the same
patched rewards, and reports each call's peak memory above what was held before it (CPU: peak-RSS
increase in a fresh process, as in benchmarks/decompose.py; CUDA: max_memory_allocated).

    python benchmarks/patching.py                        # CPU, one thread: ~3 min on 2 cores
    python benchmarks/patching.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import tempfile
from pathlib import Path

import numpy as np
import torch
from decompose import anonymous_weights, build_model, cpu_memory_mode, peak_bytes, prepared, timed
from transformers.utils.logging import disable_progress_bar

import rewardlens
from rewardlens import Pair, RewardModel
from rewardlens.causal._engine import head_slice, site_point, sites
from rewardlens.causal._patching import patch
from rewardlens.zoo._demo import DEMO_PAIRS

SWEEPS = {"read_sublayer": ("read", "sublayer"), "read_head": ("read", "head"), "whole_sublayer": ("all", "sublayer")}


def make_pairs(model: RewardModel, n_pairs: int, lo: int = 60, hi: int = 130) -> list[Pair]:
    """Token-aligned pairs of `lo`-`hi` tokens: demo responses padded with other demo sentences, the
    rejected side stating different numbers (kept only when both sides tokenize to the same length)."""
    sentences = [t for p in DEMO_PAIRS for t in (p.chosen, p.rejected)]
    pairs, i = [], 0
    while len(pairs) < n_pairs:
        base = DEMO_PAIRS[i % len(DEMO_PAIRS)]
        body = " ".join(sentences[(i * 5 + j) % len(sentences)] for j in range(1 + i % 6))
        a, b = (i * 7) % 10, (i * 7 + 3) % 10
        chosen = f"{base.chosen} {body} In short, {a}{a} of {b}{a} cases."
        rejected = f"{base.chosen} {body} In short, {b}{a} of {a}{a} cases."
        pair = Pair(str(base.prompt), chosen, rejected)
        seqs, _ = model.encode([pair])
        if len(seqs[0].ids) == len(seqs[1].ids) and lo <= len(seqs[0].ids) <= hi:
            pairs.append(pair)
        i += 1
    return pairs


@contextlib.contextmanager
def _hook(point, fn):
    if point.where == "in":
        def pre(m, args, kwargs):
            if args:
                return (fn(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}
        handle = point.module.register_forward_pre_hook(pre, with_kwargs=True)
    else:
        handle = point.module.register_forward_hook(lambda m, a, o: fn(o))
    try:
        yield
    finally:
        handle.remove()


def naive(model: RewardModel, pairs: list[Pair], positions: str, level: str) -> np.ndarray:
    """Patched chosen rewards [n, P] (noising) by one full forward per (pair, part)."""
    seqs, _ = model.encode(pairs)
    sweep = sites(model, level)
    out = np.zeros((len(pairs), len(sweep)))
    dummy = torch.zeros(1, dtype=torch.long)

    def forward(ids: list[int]) -> float:
        with torch.no_grad():
            return float(model.model(input_ids=torch.tensor([ids], device=model.device), use_cache=False).logits[0, 0])

    for i in range(len(pairs)):
        chosen, rejected = seqs[2 * i].ids, seqs[2 * i + 1].ids
        forward(chosen)  # the clean run the naive loop pays for
        grabbed = {}
        with contextlib.ExitStack() as stack:
            for site in sweep:
                def keep(x, key=site.key, grabbed=grabbed):
                    grabbed[key] = (x[0] if isinstance(x, tuple) else x)[0].detach().clone()
                    return x
                stack.enter_context(_hook(site_point(model, site, dummy), keep))
            forward(rejected)  # the source run
        cols = [len(chosen) - 1] if positions == "read" else list(range(len(chosen)))
        for j, site in enumerate(sweep):
            sl, src = head_slice(model, site), grabbed[site.key]

            def put(x, sl=sl, src=src, cols=cols):
                x = (x[0] if isinstance(x, tuple) else x).clone()
                x[0, cols, sl] = src[cols][:, sl].to(x.dtype)
                return x
            with _hook(site_point(model, site, dummy), put):
                out[i, j] = forward(chosen)
    return out


def engine(model: RewardModel, pairs: list[Pair], positions: str, level: str, bs: int) -> np.ndarray:
    return patch(model, pairs, positions=positions, level=level, batch_size=bs).patched_chosen


def cpu_peaks(path: str, dtype: str, threads: int, n_pairs: int, bs: int) -> dict[str, int]:
    """Peak-RSS increase of each engine sweep and of the naive loop on one pair; a fresh process."""
    reset = cpu_memory_mode()
    torch.set_num_threads(threads or torch.get_num_threads())
    disable_progress_bar()
    model = rewardlens.load(path, dtype=dtype)
    anonymous_weights(model)
    pairs = make_pairs(model, n_pairs)
    engine(model, pairs[:1], "read", "sublayer", 1)  # first-call work
    peaks = {name: peak_bytes(lambda p=p, lv=lv: engine(model, pairs, p, lv, bs), torch.device("cpu"), reset)
             for name, (p, lv) in SWEEPS.items()}
    peaks["naive (one forward)"] = peak_bytes(lambda: naive(model, pairs[:1], "read", "sublayer"),
                                              torch.device("cpu"), reset)
    return peaks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("layers", 32), ("hidden", 128), ("heads", 8), ("kv-heads", 8), ("intermediate", 448),
                          ("pairs", 16), ("batch-size", 8)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch's default)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--sweeps", nargs="+", choices=list(SWEEPS), default=list(SWEEPS), help="run only these sweeps")
    args = ap.parse_args()
    device = prepared(args)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp), args)
        model = rewardlens.load(path, device=args.device, dtype=args.dtype)
        if device.type == "cpu":
            anonymous_weights(model)
        pairs = make_pairs(model, args.pairs)
        lengths = np.array([len(s.ids) for s in model.encode(pairs)[0]])
        print(f"model: {model!r}, hidden {args.hidden}, {args.heads} heads, intermediate {args.intermediate}, "
              f"device {args.device}, threads {torch.get_num_threads()}")
        print(f"inputs: {len(pairs)} token-aligned pairs, {lengths.min()}-{lengths.max()} tokens "
              f"(mean {lengths.mean():.0f}), batch size {args.batch_size}\n")
        engine(model, pairs[:2], "read", "head", 2)  # warm-up
        print(f"{'sweep':<16}{'parts':>7}{'naive s':>10}{'engine s':>10}{'speed-up':>10}{'max |diff|':>12}")
        for name, (positions, level) in SWEEPS.items():
            if name not in args.sweeps:
                continue
            t_naive, want = timed(lambda p=positions, lv=level: naive(model, pairs, p, lv), device)
            t_engine, got = timed(lambda p=positions, lv=level: engine(model, pairs, p, lv, args.batch_size), device)
            print(f"{name:<16}{got.shape[1]:>7}{t_naive:>10.2f}{t_engine:>10.2f}{t_naive / t_engine:>9.1f}x"
                  f"{np.abs(got - want).max():>12.2e}")
        if args.no_memory:
            return
        if device.type == "cpu":
            with mp.get_context("spawn").Pool(1) as pool:
                peaks = pool.apply(cpu_peaks, (path, args.dtype, args.threads, args.pairs, args.batch_size))
        else:
            peaks = {name: peak_bytes(lambda p=p, lv=lv: engine(model, pairs, p, lv, args.batch_size), device)
                     for name, (p, lv) in SWEEPS.items()}
            peaks["naive (one forward)"] = peak_bytes(lambda: naive(model, pairs[:1], "read", "sublayer"), device)
        base = peaks["naive (one forward)"]
        print("\npeak memory above the loaded model:")
        for name, b in peaks.items():
            print(f"  {name:<22}{b / 2**20:>9.1f} MiB" + (f"  ({b / max(base, 1):.1f}x the naive loop's)"
                                                           if name in SWEEPS else ""))


if __name__ == "__main__":
    main()
