"""Which parts write the preference? Exact direct attribution (observational) next to read-position
activation patching (causal): the total and the path-frozen direct effect of every head and MLP.

    python examples/which_parts_write_it.py [MODEL --pairs FILE] [--top 8]
"""

import numpy as np
from _common import model_and_pairs

import rewardlens as rl

model, pairs, args = model_and_pairs(__doc__, lambda p: p.add_argument("--top", type=int, default=8))
att = rl.attribute(model, pairs, level="head")
assert np.abs(att.residual_error).max() < 1e-3  # parts + constant = the model's reward
fa = rl.faithfulness(model, pairs, level="head")  # attribution, direct, total, attribution patching

order = np.argsort(-np.abs(fa.total.mean(0)))[: args.top]
print(f"{'part':<14}{'attribution':>13}{'direct':>10}{'total':>10}{'indirect':>10}   (mean over pairs, reward units)")
for i in order:
    print(f"{fa.names[i]:<14}{fa.attribution.mean(0)[i]:>+13.3f}{fa.direct.mean(0)[i]:>+10.3f}"
          f"{fa.total.mean(0)[i]:>+10.3f}{fa.indirect.mean(0)[i]:>+10.3f}")
for est in ("direct", "total"):
    mean, lo, hi = fa.pooled(est)
    print(f"attribution vs {est}: mean per-pair Spearman ρ {mean:+.2f} [{lo:+.2f}, {hi:+.2f}]")
