"""Feature ablation at one layer, batched, against the naive loop and a plain forward (issue 28, Scale).

A random-init Llama reward model (the shape of benchmarks/decompose.py's, `--layers` deep) is saved
with the demo tokenizer and loaded by `rewardlens.load`; a seeded random TopK SAE sits on the residual
after `--layer`. On `--pairs` demo pairs it times, in `--rounds` interleaved rounds (A B C A B C ...,
after a warm-up), three calls:

- engine: `feature_patch(mode="ablate")` of the `--features` top features of the layer (by mean
  |contribution|), `--batch-size` rows (inputs × feature edits) per forward;
- naive: one clean forward per sequence, then one full unpadded forward per (sequence, feature) with a
  hook that subtracts `f_i d_i` at the read token of the layer's output;
- forward: the plain Hugging Face forward of the same pairs on pre-built padded batches.

It prints the median seconds of each (with the range over rounds), the per-round ratios naive / engine
and engine / forward (median [min, max]), and the largest difference between the two ways' patched
rewards. Each edited copy starts after the SAE's layer from the batch's recorded residual (stepped), so
engine / forward is about the recording and its proof (three forwards) plus features × the layers above
the hook, divided by what batching saves.

    python benchmarks/sae_patch.py                                    # CPU, one thread: ~4 min
    python benchmarks/sae_patch.py --pairs 4 --rounds 5 --layers 4    # a quick check
    python benchmarks/sae_patch.py --device cuda --batch-size 256
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from decompose import anonymous_weights, build_model, make_pairs, prepared, timed

import rewardlens
from rewardlens import Pair, RewardModel
from rewardlens.sae import SAEConfig, TopKSAE, attribute_features, feature_patch


def top_features(model: RewardModel, sae: TopKSAE, pairs: list[Pair], layer: int, n: int) -> list[int]:
    att = attribute_features(model, sae, pairs, layer=layer, fit=None)
    top = [f for f, _ in att.top(n, by="mean_abs")]
    if len(top) < n:
        raise SystemExit(f"only {len(top)} features fired on these pairs; use more --pairs or fewer --features")
    return top


def naive(model: RewardModel, sae: TopKSAE, pairs: list[Pair], layer: int, features: list[int]) -> np.ndarray:
    """Rewards [2·n_pairs, F] with each feature ablated alone: one hooked full forward per (sequence, feature)."""
    seqs, _ = model.encode(pairs)
    block = model.model.model.layers[layer]
    W = sae.W_dec.detach().to(model.device, torch.float32)
    out = np.zeros((len(seqs), len(features)))

    def forward(ids: list[int]) -> float:
        with torch.no_grad():
            return float(model.model(input_ids=torch.tensor([ids], device=model.device), use_cache=False).logits[0, 0])

    for r, s in enumerate(seqs):
        grabbed: list[torch.Tensor] = []

        def keep(m: torch.nn.Module, a: object, o: object, grabbed: list[torch.Tensor] = grabbed) -> None:
            grabbed.append((o[0] if isinstance(o, tuple) else o)[0, -1])  # type: ignore[index]
        handle = block.register_forward_hook(keep)
        forward(s.ids)  # the clean run: the layer's residual at the read token, to encode
        handle.remove()
        codes = sae.codes(grabbed[0].float()[None].to(sae.b_dec.device))[0].to(model.device)
        for j, f in enumerate(features):
            step = codes[f] * W[f]

            def minus(m: torch.nn.Module, a: object, o: object, step: torch.Tensor = step) -> object:
                x = (o[0] if isinstance(o, tuple) else o).clone()  # type: ignore[index]
                x[0, -1] -= step.to(x.dtype)
                return (x, *o[1:]) if isinstance(o, tuple) else x
            handle = block.register_forward_hook(minus)
            out[r, j] = forward(s.ids)
            handle.remove()
    return out


def plain_forward(model: RewardModel, pairs: list[Pair], bs: int) -> Callable[[], object]:
    batches = list(model.batches(model.encode(pairs)[0], bs))

    def run() -> object:
        with torch.no_grad():
            return [model.model(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False).logits
                    for _, b in batches]
    return run


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3g} [{min(xs):.3g}, {max(xs):.3g}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("layers", 8), ("hidden", 128), ("heads", 8), ("kv-heads", 8), ("intermediate", 448),
                          ("pairs", 8), ("features", 64), ("batch-size", 64), ("rounds", 5), ("expansion", 8),
                          ("k", 32)):
        ap.add_argument(f"--{flag}", type=int, default=default)
    ap.add_argument("--layer", type=int, default=None, help="the SAE's layer (default: the middle one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch's default)")
    args = ap.parse_args()
    device = prepared(args)
    with tempfile.TemporaryDirectory() as tmp:
        model = rewardlens.load(build_model(Path(tmp), args), device=args.device, dtype=args.dtype)
        if device.type == "cpu":
            anonymous_weights(model)
        layer = args.layers // 2 if args.layer is None else args.layer
        sae = TopKSAE(model.d_model, SAEConfig(expansion_factor=args.expansion, k=args.k), seed=0).to(model.device)
        pairs = make_pairs(args.pairs)
        feats = top_features(model, sae, pairs, layer, args.features)
        lengths = np.array([len(s.ids) for s in model.encode(pairs)[0]])
        print(f"model: {model!r}, hidden {args.hidden}, device {args.device}, threads {torch.get_num_threads()}")
        print(f"SAE at layer {layer}: {sae.n_latents} latents, k {args.k}; {len(feats)} features ablated one at a "
              f"time on {len(pairs)} pairs ({lengths.min()}-{lengths.max()} tokens), batch size {args.batch_size}\n")
        calls: dict[str, Callable[[], object]] = {
            # approx=False: the edits alone, as the naive loop (total_approx adds one forward + backward per batch)
            "engine": lambda: feature_patch(model, sae, pairs, layer=layer, features=feats,
                                            batch_size=args.batch_size, n_boot=1, approx=False),
            "naive": lambda: naive(model, sae, pairs, layer, feats),
            "forward": plain_forward(model, pairs, min(args.batch_size, 2 * len(pairs))),
        }
        feature_patch(model, sae, pairs[:1], layer=layer, features=feats[:2], n_boot=1, approx=False)  # warm-up
        times: dict[str, list[float]] = {name: [] for name in calls}
        outs: dict[str, object] = {}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                t, outs[name] = timed(fn, device)
                times[name].append(t)
        for name, ts in times.items():
            print(f"{name:<8} {spread(ts)} s (median [min, max] over {args.rounds} rounds)")
        per = lambda a, b: [x / y for x, y in zip(times[a], times[b])]  # noqa: E731 - per-round ratios
        print(f"\nnaive / engine   {spread(per('naive', 'engine'))}x")
        print(f"engine / forward {spread(per('engine', 'forward'))}x")
        print(f"naive / forward  {spread(per('naive', 'forward'))}x")
        got = outs["engine"].patched  # type: ignore[attr-defined]
        print(f"max |engine − naive| patched reward: {np.abs(got - outs['naive']).max():.2e}")


if __name__ == "__main__":
    main()
