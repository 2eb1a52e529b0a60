"""What does one head do? Its exact direct contribution on each pair, and what patching or ablating
it does to the margin, directly and through later layers.

    python examples/what_does_one_head_do.py [MODEL --pairs FILE] [--head attn_L1_H2]
"""

import numpy as np
from _common import model_and_pairs

import rewardlens as rl

model, pairs, args = model_and_pairs(__doc__, lambda p: p.add_argument("--head", default=None))
att = rl.attribute(model, pairs, level="head")
heads = [n for n in att.names if n.startswith("attn_") and "_H" in n]
# Default: the head whose direct contribution to the margin is largest.
head = args.head or max(heads, key=lambda n: abs(att.margin[:, att.names.index(n)].mean()))
if head not in heads:
    raise SystemExit(f"unknown head {head!r}; heads are named like {heads[0]!r}")

col = att.names.index(head)
total = rl.patch(model, pairs, level="head")                       # noising: rejected's output into chosen and back
direct = rl.patch(model, pairs, level="head", estimand="direct")   # the same, later layers frozen
ablated = rl.patch(model, pairs, level="head", mode="ablation", ablation="mean")  # mean over the pairs' inputs
j = total.names.index(head)
print(f"{head}: what it writes to the chosen − rejected margin (reward units)")
print(f"{'pair':<6}{'margin':>9}{'attribution':>13}{'direct':>9}{'total':>9}{'ablated':>9}")
for i, pid in enumerate(total.pair_ids):
    print(f"{pid:<6}{total.margin[i]:>+9.3f}{att.margin[i, col]:>+13.3f}{direct.effect[i, j]:>+9.3f}"
          f"{total.effect[i, j]:>+9.3f}{ablated.effect[i, j]:>+9.3f}")
share = att.margin[:, col].sum() / total.margin.sum()
print(f"\nits direct share of the summed margin: {share:+.1%}; "
      f"mean total effect {total.effect[:, j].mean():+.3f}, of which through later layers "
      f"{np.mean(total.effect[:, j] - direct.effect[:, j]):+.3f}")
