"""Does it reward length (or confidence, lists, flattery, ...)? Matched probe pairs that differ in one
attribute, on 72 built-in items, with bootstrap CIs, Wilcoxon p and Benjamini–Hochberg q.

    python examples/does_it_reward_length.py [MODEL --pairs FILE]
"""

from _common import model_and_pairs

import rewardlens as rl

model, pairs, _ = model_and_pairs(__doc__)
# The flag floor: 0.25 x the items' reward sd; each flag is checked under the pairs' mean |margin| too, and one
# that scale changes is fragile (shown, not a finding).
pr = rl.probe(model, reference=pairs)
frame = pr.to_frame()
print(frame[["axis", "n", "mean", "ci_low", "ci_high", "q", "flagged", "fragile"]].to_string(index=False))
print(f"\n{pr.describe()}")
i = pr.axes.index("length")
verdict = "rewards" if pr.mean[i] > 0 else "penalises"
print(f"\nlength: the model {verdict} added length by {pr.mean[i]:+.3f} [{pr.ci_low[i]:+.3f}, {pr.ci_high[i]:+.3f}] "
      f"reward units ({'flagged' if pr.flagged[i] else 'not flagged'}{', fragile' if pr.fragile[i] else ''}; "
      f"floor {pr.scale * 0.25:.3f})")
