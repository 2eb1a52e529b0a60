"""What the new reward-model kinds cost: a judge, a process RM and a DPO reward on one real model.

The real SmolLM2-135M-Instruct language model (`rewardlens.zoo.realmodels`, its LM head is its tied
embeddings) read three ways, on held-out dpo_en_demo pairs:
- a judge: log-odds of "Yes" over "No" where its answer starts;
- a PRM: "+" over "-" at every newline of the response, steps combined by min;
- a DPO reward: the model as its own policy and reference (the reward is 0; the cost is real).

The yardstick is what scoring costs at all: one unpadded plain forward of every sequence the kind
reads (the judge's question, the PRM's answer, the DPO policy's and its reference's). Each
instrument's time is printed as a ratio to it, measured in the same run. A reward read at a set
of positions is decomposed from one traced forward per batch, as a one-token reward is, however
many positions it reads. A DPO reference's terms are remembered by token ids, so only the first
call (`score`) pays the reference forward. Patching at a set of positions cannot use the one-token
engines' copies of the read token: each (sequence, part) is a run of its own from the patched
layer up (`stepped_sweep`), so it costs about one forward per two parts.

    python benchmarks/rm_kinds.py                   # CPU, one thread, the 3 pairs of <= 400 tokens: ~8 min
    python benchmarks/rm_kinds.py --device cuda --dtype bfloat16 --pairs 32
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
from decompose import seconds

import rewardlens as rl
from rewardlens.zoo.realmodels import dpo_pairs, reward_model_dir


def plain(models: list[torch.nn.Module], seqs: list[list[int]], device: torch.device) -> Callable[[], None]:
    """One unpadded, hook-free forward of every sequence through every model the reward needs."""
    ids = [torch.tensor([s], device=device) for s in seqs]

    def run() -> None:
        with torch.no_grad():
            for model in models:
                for x in ids:
                    model(input_ids=x)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="held-out pairs with a newline in both responses")
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device, folder = torch.device(args.device), str(reward_model_dir("smollm2-dpo"))
    opts = {"device": args.device, "dtype": getattr(torch, args.dtype)}
    kinds = {
        "judge": rl.model.load_judge(folder, tokens=("Yes", "No"), **opts),
        "prm": rl.model.load_prm(folder, separator="\n", tokens=("+", "-"), **opts),
        "dpo": rl.model.load_dpo(folder, folder, beta=0.1, **opts),
    }
    prm = kinds["prm"]
    pairs = []
    for p in dpo_pairs("test"):  # short pairs with a newline in both responses (PRM steps)
        try:
            seqs = prm.encode([p])[0]
        except rl.RewardLensError:
            continue
        if max(len(s.ids) for s in seqs) <= args.max_tokens:
            pairs.append(p)
        if len(pairs) == args.pairs:
            break
    print(f"SmolLM2-135M-Instruct ({prm.n_layers} layers), {args.device} {args.dtype}, {args.threads} thread(s); "
          f"{len(pairs)} pairs")
    bs = args.batch_size
    for name, model in kinds.items():
        seqs = [s.ids for s in model.encode(pairs)[0]]
        reads = sum(len(s.reads or (0,)) for s in model.encode(pairs)[0])
        models = [model.model] + ([model.reference.model] if model.reference is not None else [])
        forward = plain(models, seqs, device)
        forward()  # warm-up
        base = seconds(forward, device)
        mode = "noising" if not model.reads.multi else "ablation"  # the sides' read counts differ
        calls: dict[str, Callable[[], object]] = {
            "score": lambda m=model: m.score(pairs, batch_size=bs),
            "attribute sublayer": lambda m=model: rl.attribute(m, pairs, batch_size=bs),
            "attribute head": lambda m=model: rl.attribute(m, pairs, level="head", batch_size=bs),
            "lens": lambda m=model: rl.lens(m, pairs, batch_size=bs),
            f"patch sublayer ({mode})": lambda m=model, how=mode: rl.patch(m, pairs, mode=how, batch_size=bs),
            f"attribution_patch ({mode})": lambda m=model, how=mode: rl.causal.attribution_patch(m, pairs, mode=how,
                                                                                         batch_size=bs),
        }
        print(f"\n{name}: {len(seqs)} sequences of {min(map(len, seqs))}-{max(map(len, seqs))} tokens, {reads} reads; "
              f"plain forward{'s (policy and reference)' if len(models) > 1 else ''} {base:.2f} s")
        got: dict[str, object] = {}
        for label, fn in calls.items():
            t = seconds(lambda f=fn, k=label, into=got: into.__setitem__(k, f()), device)
            print(f"  {label:28s} {t:7.2f} s  {t / base:6.2f}x")
        att = got["attribute head"]
        assert isinstance(att, rl.Attribution)
        print(f"  closure: max |reward - (parts + constant)| = {np.abs(att.residual_error).max():.1e}")


if __name__ == "__main__":
    main()
