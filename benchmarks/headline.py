"""The headline: the full audit of an RM of Llama-3.1-8B's shape over the paper's 695 validation pairs.

A random-init `LlamaForSequenceClassification` of Llama-3.1-8B's shape (32 layers, d 4096, 32 query
and 8 key/value heads, MLP 14336, vocabulary 128256) in bf16, wrapped with rewardlens's built-in
byte-level tokenizer, audits 695 synthetic pairs whose sides are 200–600 tokens long: the default
audit (`rl.audit`: lens, attribution at sublayer and head level, faithfulness, probes, concepts,
divergence, token attribution) into a fresh store, then the report. Random weights give the same
work as trained ones: every instrument's cost is set by the shapes, not the values, except where an
engine's proof depends on them (in bf16 a continuation's proof is granted only to a model whose attention
sees positions: `qk_scale`; the script prints the allowance).

It prints each step's time, the plain forward's time over the same tokens (each side alone, no
hooks, no padding: what any RM pays to score the pairs at all), their ratio, and peak accelerator
memory. The goal is the whole audit under 10 minutes on one H200.

On CPU (no device, or `--small`) the same code runs at a small shape, so the script is checked
where no accelerator is lent:

    python benchmarks/headline.py                       # CUDA when present: 8B shape, bf16, 695 pairs
    python benchmarks/headline.py --small               # 2-layer, d 256, 16 pairs of 40-120 tokens
    python benchmarks/headline.py --small --dtype bfloat16   # the same in bf16: the GPU run's engine choices
    python benchmarks/headline.py --pairs 64            # a shorter run of the 8B shape
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers as tf
from decompose import seconds, timed

import rewardlens as rl
from audit import plain_forward
from rewardlens.audit import Decided, NaturalStates, Plan, Store
from rewardlens.audit.internal import collect, plan_for_model, run_pairs, run_whole
from rewardlens.audit.report import write_report
from rewardlens.model.internal import proof_tol
from rewardlens.zoo import DEMO_PAIRS, build_tokenizer

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                max_position_embeddings=8192)
"""Llama-3.1-8B's shape (its config.json, with a context long enough for these pairs)."""
SMALL = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=4096, max_position_embeddings=1024)
"""The CPU shape: the same code path at a size a CPU finishes in a minute or two."""
def qk_scale(config: tf.LlamaConfig) -> float:
    """What query and key weights are scaled by after the random init: at a narrower shape than 8B's, up to
    the spread 8B's init gives their outputs (std 0.02 × √4096 per entry), so attention logits are as sharp
    at the CPU shape as at the GPU one (at 8B itself: 1, the plain init). In bf16 the continuation proof is
    granted only where a position off by one shows (`proof_tol`), which the plain init at width 256 does
    not; the script prints which way it went. Only values change, never a shape."""
    return max(1.0, 0.02 * LLAMA_8B["hidden_size"] ** 0.5 / (config.initializer_range * config.hidden_size ** 0.5))


def build(shape: dict[str, Any], device: torch.device, dtype: torch.dtype) -> rl.RewardModel:
    """A random-init RM of `shape` built directly on `device` in `dtype` (no fp32 copy of 8B weights)."""
    tok = build_tokenizer()
    config = tf.LlamaConfig(**shape, num_labels=1, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                            bos_token_id=None)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            hf = tf.LlamaForSequenceClassification(config)
    finally:
        torch.set_default_dtype(default)
    hf.eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(qk_scale(config))
            layer.self_attn.k_proj.weight.mul_(qk_scale(config))
    return rl.wrap(hf, tok)


def synthetic_pairs(model: rl.RewardModel, n: int, lo: int, hi: int, seed: int = 0) -> list[rl.Pair]:
    """`n` pairs of words from the tokenizer's corpus, each response `lo`–`hi` tokens (its own length drawn
    uniformly), the prompt a sentence."""
    rng = random.Random(seed)
    words = [w for p in DEMO_PAIRS for side in (p.chosen, p.rejected) for w in side.split()]

    def text(tokens: int) -> str:
        out: list[str] = []
        while len(model.tokenizer(" ".join(out))["input_ids"]) < tokens:
            out += rng.choices(words, k=max(1, (tokens - len(out)) // 2))
        return " ".join(out)

    return [rl.Pair(prompt=text(rng.randint(20, 60)), chosen=text(rng.randint(lo, hi)),
                    rejected=text(rng.randint(lo, hi)), id=f"h{i}") for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="the CPU shape even when CUDA is present")
    ap.add_argument("--pairs", type=int, default=None, help="pairs (default 695; 16 at the small shape)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--chunk-size", type=int, default=32)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                    help="the backbone's dtype (default: bfloat16 on CUDA, float32 on CPU)")
    args = ap.parse_args()
    small = args.small or not torch.cuda.is_available()
    device = torch.device("cpu" if small and not torch.cuda.is_available() else "cuda")
    dtype = getattr(torch, args.dtype) if args.dtype else torch.float32 if device.type == "cpu" else torch.bfloat16
    shape, (lo, hi) = (SMALL, (40, 120)) if small else (LLAMA_8B, (200, 600))
    n = args.pairs or (16 if small else 695)

    built, model = timed(lambda: build(shape, device, dtype), device)
    pairs = synthetic_pairs(model, n, lo, hi)
    lengths = [len(s.ids) for s in model.encode(pairs)[0]]
    print(f"model: random-init Llama RM, {shape['num_hidden_layers']} layers, d {shape['hidden_size']}, {device} "
          f"{str(dtype).removeprefix('torch.')} (built in {built:.1f} s); {n} pairs, {min(lengths)}-{max(lengths)} "
          f"tokens a sequence, {sum(lengths)} in all")
    allowance = proof_tol(model)
    print(f"continuation proof in {str(dtype).removeprefix('torch.')}: "
          + ("refused: every engine runs its plain path" if allowance is None else f"allowance {allowance:.2e}"))
    forward = seconds(plain_forward(model, pairs), device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    weights = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    plan = Plan(chunk_size=args.chunk_size, batch_size=args.batch_size)
    steps: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "results.sqlite")
        plan = plan_for_model(model, plan, None)
        steps["decide (tokenize every pair once)"], decided = timed(lambda: Decided.of(model, pairs), device)
        natural = NaturalStates()  # as `audit` runs them: the per-pair traces' residuals kept for divergence
        steps["per-pair part (run_pairs)"] = seconds(
            lambda: run_pairs(model, pairs, store, plan, decided=decided, progress=True, natural=natural), device)
        steps["whole-model part (run_whole)"] = seconds(
            lambda: run_whole(model, pairs, store, plan, progress=True, decided=decided, natural=natural), device)
        steps["read back (collect)"], result = timed(lambda: collect(model, pairs, store, plan, decided=decided),
                                                     device)
        steps["report (write_report)"] = seconds(lambda: write_report(result, Path(tmp) / "report"), device)
        store.close()
    total = sum(steps.values())
    print(f"\nplain forward of the same tokens: {forward:8.1f} s")
    for name, s in steps.items():
        print(f"  {name:<36} {s:8.1f} s  {s / forward:6.2f}x the forward")
    print(f"  {'the whole audit':<36} {total:8.1f} s  {total / forward:6.2f}x the forward  "
          f"({total / 60:.1f} min; goal < 10 min on one H200)")
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        print(f"peak accelerator memory: {peak / 2**30:.1f} GiB ({(peak - weights) / 2**30:.1f} GiB above the "
              f"{weights / 2**30:.1f} GiB of weights)")


if __name__ == "__main__":
    main()
