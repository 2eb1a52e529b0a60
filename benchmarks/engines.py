"""Each patching engine's cost on the shapes that decide between them, against the registry's cost model.

Random-init Llama reward models (hidden 64, 4 heads) of 2 and 24 layers with the demo tokenizer; the demo
pairs (both sides share their prompt and chat template). For each shape every engine that accepts the patch
is forced (`patch(engine=...)`) in interleaved rounds (A B C A B C ...); the table prints each engine's
median time and [min, max] over rounds as a ratio to the engine the registry chooses, beside the ratio
the cost model predicts (`Engine.cost` × `FACTORS`) and the one it predicts with every factor 1 (token-layers
alone: `measured / token-layers` is what a factor should be). Every engine's numbers are checked equal.

    python benchmarks/engines.py            # CPU: ~4 min on 2 shared cores
    python benchmarks/engines.py --real     # instead: SmolLM2-135M's reward model (30 layers), prefix
                                            # noising of 2 held-out pairs, suffix vs stepped: ~5 min
    python benchmarks/engines.py --rounds 7 --pairs 8 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers as tf
from transformers.utils.logging import disable_progress_bar

import rewardlens as rl
from rewardlens.causal import patch
from rewardlens.causal._engine import sites
from rewardlens.causal._registry import FACTORS, REGISTRY, Job, choose
from rewardlens.causal._spec import PatchSpec
from rewardlens.errors import RewardLensWarning
from rewardlens.zoo import build_tokenizer
from rewardlens.zoo._demo import DEMO_PAIRS

SHAPES = {
    "prefix, 24 layers": (24, PatchSpec(positions="prefix")),
    "prefix, 2 layers": (2, PatchSpec(positions="prefix")),
    "read, 24 layers": (24, PatchSpec()),
    "read heads, 2 layers": (2, PatchSpec(level="head")),
}


def build(layers: int, root: Path, device: str) -> rl.RewardModel:
    """A random-init Llama reward model of `layers` layers, saved and loaded as a user would."""
    tok = build_tokenizer()
    config = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                            num_labels=1)
    torch.manual_seed(0)
    model = tf.AutoModelForSequenceClassification.from_config(config).eval()
    path = root / f"llama{layers}"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return rl.load(str(path), device=device)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _per(times: dict[str, list[float]], tokens: dict[str, float], name: str) -> float:
    """`name`'s median time per token-layer over batched_sweep's: what its cost factor should be."""
    return statistics.median(times[name]) / tokens[name] / (statistics.median(times["batched_sweep"])
                                                            / tokens["batched_sweep"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--real", action="store_true", help="the real SmolLM2-135M reward model's prefix shape")
    args = parser.parse_args()
    disable_progress_bar()
    warnings.simplefilter("ignore", RewardLensWarning)
    torch.set_num_threads(1)
    pairs = list(DEMO_PAIRS[: args.pairs])
    if args.real:
        real(args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        models = {n: build(n, Path(tmp), args.device) for n in sorted({layers for layers, _ in SHAPES.values()})}
        for shape, (layers, spec) in SHAPES.items():
            model = models[layers]
            compare(shape, model, pairs, spec, args.rounds)
    print("\nfactors in use:", {k: FACTORS[k] for k in REGISTRY if k in FACTORS})


def real(rounds: int) -> None:
    """SmolLM2-135M's reward model (the peer comparison's, benchmarks/peer.py), prefix noising of 2 held-out
    pairs of at most 160 tokens a side: the suffix and stepped engines (batched takes minutes a round)."""
    from rewardlens.zoo.realmodels import dpo_pairs, load_reward_model

    model = load_reward_model("smollm2-dpo")
    pairs = [p for p in dpo_pairs("test") if max(len(s.ids) for s in model.encode([p])[0]) <= 160][:2]
    compare("prefix, SmolLM2-135M RM (30 layers)", model, pairs, PatchSpec(positions="prefix"), rounds,
            only=("suffix_sweep", "stepped_sweep"))


def compare(shape: str, model: rl.RewardModel, pairs: list[rl.Pair], spec: PatchSpec, rounds: int,
            only: tuple[str, ...] | None = None) -> None:
    """Time every engine that accepts `spec` (or those in `only`) in interleaved rounds; print the ratios."""
    job = Job(model, model.encode(pairs)[0], spec, sites(model, spec.level))
    choice = choose(job)
    engines = [e.name for e, _ in choice.ranked if e.name != "reference" and (only is None or e.name in only)]
    cost = {e.name: c for e, c in choice.ranked}
    tokens = {e.name: e.cost(job) for e, _ in choice.ranked}
    chosen = engines[0]
    times: dict[str, list[float]] = {e: [] for e in engines}
    results = {e: patch(model, pairs, spec=spec, engine=e) for e in engines}  # warm-up, and the numbers
    for name, got in results.items():
        np.testing.assert_allclose(got.patched_chosen, results[chosen].patched_chosen, atol=1e-4,
                                   err_msg=f"{shape}: {name}")
    for _ in range(rounds):
        for name in engines:
            times[name].append(timed(lambda m=model, s=spec, e=name: patch(m, pairs, spec=s, engine=e)))
    base = statistics.median(times[chosen])
    print(f"\n{shape} ({spec.name}, {len(pairs)} pairs): registry chooses {chosen}; "
          f"{chosen} median {base * 1e3:.0f} ms")
    print(f"  {'engine':18s} {'measured':>9s} {'[min, max]':>14s} {'model':>7s} {'tok-lay':>8s} "
          f"{'time per tok-lay vs batched':>28s}")
    for name in engines:
        ratios = [t / base for t in times[name]]
        per = "" if "batched_sweep" not in times else f"{_per(times, tokens, name):28.2f}"
        print(f"  {name:18s} {statistics.median(ratios):9.2f} [{min(ratios):5.2f}, {max(ratios):5.2f}] "
              f"{cost[name] / cost[chosen]:7.2f} {tokens[name] / tokens[chosen]:8.2f} {per}")


if __name__ == "__main__":
    main()
