"""Attribution graphs on the real SmolLM2-135M reward model: one pair's margin graph as a multiple of a plain forward.

The real reward model (`rewardlens.zoo.realmodels`, trained head), one held-out dpo_en_demo pair stretched or
cut to `--length` tokens a side (the response repeated, then cut at a token boundary). The yardstick is one
unpadded plain forward of both sides (no hooks). The graph is `rewardlens.graphs.graph` on the pair (both
sides' graphs and the margin graph) with transcoders of E1's trained shape (the cached set under `--transcoders`
if given; else random ones with `--d-sae` features and TopK `--k`: the cost depends on the active set's size, not
on what the features mean). Timed in `--rounds` interleaved rounds (forward, graph, forward, graph ...; the
forward the median of three), each ratio within its round, reported as median [min, max]; the last round also
reads the peak memory of its graph above what was held before it (CPU: peak RSS with glibc mapping every block
over 64 KiB on its own, so RSS follows live memory, `decompose.cpu_memory_mode`; CUDA: allocated). Then how the
cost grows with the length and the node cap (one round each).

The default (300 tokens a side, cap 4096) peaks near 11 GB on CPU (docs/graphs.md, "What a graph costs"): on a
smaller machine pass `--max-nodes 1024` (8.3 GB) and read the cost per 32 targets off `--caps`.

    python benchmarks/graph.py                                  # CPU: 300 tokens a side, the default cap 4096
    python benchmarks/graph.py --length 300 --max-nodes 1024 --rounds 1 --caps 256
    python benchmarks/graph.py --length 100 --max-nodes 256 --lengths 50,100 --caps 64,256 --rounds 2
    python benchmarks/graph.py --device cuda
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from decompose import cpu_memory_mode, peak_bytes

import rewardlens as rl
from audit import plain_forward
from rewardlens.graphs import MAX_NODES, graph
from rewardlens.sae import Transcoder, TranscoderConfig, Transcoders, load_transcoders
from rewardlens.zoo.realmodels import dpo_pairs, load_reward_model


def stretched_pair(model: rl.RewardModel, length: int) -> rl.Pair:
    """A held-out pair whose two sides are about `length` tokens each (responses repeated, cut by tokens)."""
    pair = dpo_pairs("test")[0]
    tok = model.tokenizer

    def fit(response: str) -> str:
        base = len(model.encode(rl.Pair(pair.prompt, "", ""))[0][0].ids)
        ids = tok.encode(response, add_special_tokens=False)
        ids = (ids * (length // max(1, len(ids)) + 2))[: max(1, length - base)]
        return tok.decode(ids)

    return rl.Pair(pair.prompt, fit(pair.chosen), fit(pair.rejected))


def random_transcoders(model: rl.RewardModel, d_sae: int, k: int) -> Transcoders:
    d = model.d_model
    tcs = {}
    for layer in range(model.n_layers):
        tc = Transcoder(TranscoderConfig(layer=layer, d_in=d, d_out=d, d_sae=d_sae, k=k, skip=True), seed=layer)
        with torch.no_grad():
            tc.W_dec.normal_(0, d**-0.5)
        tcs[layer] = tc
    return Transcoders(tcs)


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=300, help="tokens a side")
    ap.add_argument("--max-nodes", type=int, default=MAX_NODES)
    ap.add_argument("--batch-size", type=int, default=32, help="targets per backward pass")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lengths", default="", help="comma-separated lengths for the growth table")
    ap.add_argument("--caps", default="", help="comma-separated node caps for the growth table")
    ap.add_argument("--transcoders", default=None, help="a transcoder folder (else random ones)")
    ap.add_argument("--d-sae", type=int, default=1152)
    ap.add_argument("--k", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # the random transcoders' decoders: the same active sets from run to run
    reset = cpu_memory_mode() if args.device == "cpu" else None
    model = load_reward_model("smollm2-dpo", device_map=args.device) if args.device != "cpu" else \
        load_reward_model("smollm2-dpo")
    tcs = load_transcoders(args.transcoders) if args.transcoders else random_transcoders(model, args.d_sae, args.k)
    pair = stretched_pair(model, args.length)
    sides = [len(s.ids) for s in model.encode(pair)[0]]
    print(f"SmolLM2-135M RM, {sides} tokens (chosen, rejected), d_sae={tcs.d_sae}, cap={args.max_nodes}, "
          f"batch={args.batch_size}, threads={args.threads}, device={args.device}")
    forward = plain_forward(model, [pair])
    forward()
    ratios, last, peak = [], None, 0
    timed: dict[str, Any] = {}
    for r in range(args.rounds):
        f = float(np.median([seconds(forward) for _ in range(3)]))

        def one() -> None:
            t0 = time.perf_counter()
            timed["graph"] = graph(model, pair, tcs, max_nodes=args.max_nodes, batch_size=args.batch_size)[0]
            timed["seconds"] = time.perf_counter() - t0
        if r == args.rounds - 1:
            peak = peak_bytes(one, torch.device(args.device), reset)
        else:
            one()
        last, g = timed["graph"], timed["seconds"]
        ratios.append(g / f)
        print(f"round {r}: forward {f:.3f}s, margin graph {g:.1f}s, ratio {g / f:.0f}x")
    print(f"margin graph / plain forward: median {np.median(ratios):.0f}x [{min(ratios):.0f}, {max(ratios):.0f}] "
          f"(target <= 40x)")
    assert last is not None
    m = last.margin
    print(f"closure gap: chosen {last.chosen.closure_gap:.1e}, rejected {last.rejected.closure_gap:.1e}, "
          f"margin {m.closure_gap:.1e}; features {int((m.nodes.kind == 0).sum())}, past the cap "
          f"{last.chosen.dropped}+{last.rejected.dropped}; scores {m.scores}")
    for length in [int(x) for x in args.lengths.split(",") if x]:
        p = stretched_pair(model, length)
        f, g = seconds(plain_forward(model, [p])), seconds(lambda p=p: graph(model, p, tcs, max_nodes=args.max_nodes,
                                                                             batch_size=args.batch_size))
        print(f"length {length}: {g:.1f}s, {g / f:.0f}x a forward")
    for cap in [int(x) for x in args.caps.split(",") if x]:
        f, g = seconds(forward), seconds(lambda cap=cap: graph(model, pair, tcs, max_nodes=cap,
                                                               batch_size=args.batch_size))
        print(f"cap {cap}: {g:.1f}s, {g / f:.0f}x a forward")
    print(f"peak memory of the last round's margin graph above what was held before it: {peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
