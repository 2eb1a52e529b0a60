"""What did DPO teach a policy? Its implicit reward, split exactly over the policy's parts and over
the response tokens where it is read.

    python examples/what_did_dpo_learn.py [POLICY REFERENCE --pairs FILE] [--beta 0.1] [--limit N]

No folders: the `dpo_keyword` organism, a policy trained with TRL's DPOTrainer to prefer responses
with the word "Importantly", with training confined to one head.
"""

import argparse

import numpy as np

import rewardlens as rl

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("policy", nargs="?", help="the DPO-trained policy folder; default: the dpo_keyword organism")
parser.add_argument("reference", nargs="?", help="its reference (the model DPO started from)")
parser.add_argument("--pairs", help="preference pairs file")
parser.add_argument("--beta", type=float, default=0.1)
parser.add_argument("--limit", type=int, default=12)
args = parser.parse_args()
if args.policy is None:
    from rewardlens.zoo.organisms import KIND_ORGANISMS as KINDS
    from rewardlens.zoo.organisms import build, open_kind

    model, pairs = open_kind(build("dpo_keyword")), KINDS["dpo_keyword"].pairs(n=args.limit, seed=1)
else:
    if not (args.reference and args.pairs):
        parser.error("a policy needs its reference and --pairs FILE")
    model = rl.model.load_dpo(args.policy, args.reference, beta=args.beta)
    pairs = rl.load_pairs(args.pairs)[: args.limit]

att = rl.attribute(model, pairs, level="head")
margin = att.reward[0::2] - att.reward[1::2]
print(f"implicit reward: accuracy {np.mean(margin > 0):.2f}, mean margin {margin.mean():+.3f}; "
      f"closure {np.abs(att.residual_error).max():.1e}")
print("parts that write the margin (mean, reward units):")
for name, value in att.top(3, by="margin"):
    print(f"  {name:<14}{value:+.3f}")
steps = att.steps.to_frame()
tokens = model.tokenizer.convert_ids_to_tokens
print("the response token whose read differs most between the sides (over the reads both have), per pair:")
for p in range(min(len(pairs), 5)):
    c, r = steps[steps.sequence == 2 * p], steps[steps.sequence == 2 * p + 1]
    n = min(len(c), len(r))  # two responses rarely have one length: compare token k with token k
    gap = c["reward"].to_numpy()[:n] - r["reward"].to_numpy()[:n]
    k = int(np.argmax(np.abs(gap)))
    ids = model.encode([pairs[p]])[0][0].ids
    at = int(c["position"].to_numpy()[k])
    print(f"  pair {p}: read at {tokens(ids[at])!r} (predicting {tokens(ids[at + 1])!r}): {gap[k]:+.3f} "
          f"of a {margin[p]:+.3f} margin")
