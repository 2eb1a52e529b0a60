"""EAP and EAP-IG cost as a multiple of a plain forward, and the speed-up over the naive edge-patching loop.

A tiny random 16-layer Llama reward model; interleaved rounds (A B A B ...), median and range per
method, and torch's / tracemalloc's peak memory of one EAP call. Usage: python benchmarks/circuits.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).parent))
from decompose import seconds  # noqa: E402

import rewardlens as rl  # noqa: E402
from rewardlens.zoo import DEMO_PAIRS, build_tokenizer  # noqa: E402


def build(root: Path, layers: int) -> rl.RewardModel:
    tok = build_tokenizer()
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    tf.LlamaForSequenceClassification(cfg).save_pretrained(root)
    tok.save_pretrained(root)
    return rl.load(str(root))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=4)
    args = ap.parse_args()
    model = build(Path(tempfile.mkdtemp()) / "m", args.layers)
    pairs = list(DEMO_PAIRS[:args.pairs])
    device = model.device
    calls = {
        "forward": lambda: model.score(pairs),
        "eap": lambda: rl.edges(model, pairs),
        "eap-ig (5 steps)": lambda: rl.edges(model, pairs, method="eap-ig", steps=5),
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    for fn in calls.values():
        fn()  # warm-up
    for _ in range(args.rounds):
        for name, fn in calls.items():
            times[name].append(seconds(fn, device))
    scored = rl.edges(model, pairs)
    naive = seconds(lambda: [rl.path_patch(model, pairs, senders=[u], receivers=[d]) for u, d in scored.names[:20]],
                    device) / 20 * len(scored.names)
    base = np.median(times["forward"])
    for name, ts in times.items():
        med = np.median(ts)
        per = med / base / (5 if "ig" in name else 1)
        print(f"{name:18s} median {med * 1e3:8.1f} ms  range [{min(ts) * 1e3:.1f}, {max(ts) * 1e3:.1f}]  "
              f"{med / base:5.1f}x forward ({per:.1f}x per step)")
    print(f"naive loop (path_patch per edge, {len(scored.names)} edges, from 20): {naive:.2f} s, "
          f"EAP speed-up {naive / np.median(times['eap']):.0f}x")
    tracemalloc.start()
    rl.edges(model, pairs)
    print(f"peak host memory of one EAP call (tracemalloc): {tracemalloc.get_traced_memory()[1] / 2**20:.1f} MiB")
    if torch.cuda.is_available():
        print(f"peak device memory: {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
