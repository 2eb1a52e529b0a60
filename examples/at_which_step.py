"""At which step does a process reward model's preference form, and which parts write it?

Every step's score is exact, and so is its split over the model's parts. The pair's preference forms
at the step whose score differs most between the two sides.

    python examples/at_which_step.py [PRM_FOLDER --pairs FILE --separator '\\n'] [--limit N]

No folder: the `prm_steps` organism, whose planted rule marks a step wrong when it ends in a hedge
("..., maybe."), and whose rule lives in one head.
"""

import argparse

import numpy as np

import rewardlens as rl
from rewardlens.causal import patch_mode

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("model", nargs="?", help="a PRM folder (token classifier); default: the prm_steps organism")
parser.add_argument("--pairs", help="preference pairs (JSONL, CSV, ...)")
parser.add_argument("--separator", default="\\n", help="the step separator ('\\n' for a newline)")
parser.add_argument("--limit", type=int, default=12)
args = parser.parse_args()
wrong = None
if args.model is None:
    from rewardlens.zoo.organisms import KIND_ORGANISMS as KINDS
    from rewardlens.zoo.organisms import build, open_kind

    spec = KINDS["prm_steps"]
    model, pairs, wrong = open_kind(build("prm_steps")), spec.pairs(n=args.limit, seed=1), spec.wrong_step
else:
    if not args.pairs:
        parser.error("a model needs --pairs FILE")
    model = rl.model.load_prm(args.model, separator=args.separator.replace("\\n", "\n"))
    pairs = rl.load_pairs(args.pairs)[: args.limit]

att = rl.attribute(model, pairs, level="head")
print(f"closure: max |reward - (parts + constant)| = {np.abs(att.residual_error).max():.1e}")
print("step scores (chosen | rejected) and where each pair's preference forms:")
for p in range(len(pairs)):
    c, r = (att.steps.of(2 * p + side)["reward"].to_numpy() for side in (0, 1))
    k = min(len(c), len(r))
    forms = int(np.argmax(np.abs(c[:k] - r[:k])))
    planted = "" if wrong is None else f"  (the hedged step: {wrong(pairs[p])})"
    print(f"  pair {p}: {' '.join(f'{v:+.1f}' for v in c)} | {' '.join(f'{v:+.1f}' for v in r)}"
          f"  -> forms at step {forms}{planted}")
steps = att.steps.to_frame()
print("parts that write the gap at that step (chosen - rejected, mean over pairs):")
gaps = []
for p in range(len(pairs)):
    c, r = steps[steps.sequence == 2 * p], steps[steps.sequence == 2 * p + 1]
    k = min(len(c), len(r))
    forms = int(np.argmax(np.abs(c["reward"].to_numpy()[:k] - r["reward"].to_numpy()[:k])))
    gaps.append(c[att.names].to_numpy()[forms] - r[att.names].to_numpy()[forms])
mean = np.mean(gaps, axis=0)
for j in np.argsort(-np.abs(mean))[:3]:
    print(f"  {att.names[j]:<14}{mean[j]:+.2f}")
# At every step: the rejected side's k-th step into the chosen's (noising), or zero at every step
# (ablation) when some pair's sides have different numbers of steps and no step maps to another.
mode = patch_mode(model, pairs)
patched = rl.patch(model, pairs, level="head", mode=mode)
effects = patched.effect.mean(0)
top = int(np.argmax(np.abs(effects)))
print(f"patching at every step ({mode}): largest mean effect on the margin {patched.names[top]} {effects[top]:+.2f}")
