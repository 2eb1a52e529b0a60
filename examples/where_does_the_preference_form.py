"""Where does the preference form? The reward lens reads every layer's residual stream along the
head, so the chosen − rejected margin can be followed from the embeddings to the reward.

    python examples/where_does_the_preference_form.py [MODEL --pairs FILE]
"""

import numpy as np
from _common import model_and_pairs

model, pairs, _ = model_and_pairs(__doc__)
ln = __import__("rewardlens").lens(model, pairs)

# Linear lens: what the parts written so far contribute (exact, the final norm's scale frozen).
# Normed lens: the head applied to the re-normalised partial residual (logit-lens style).
for kind in ("linear", "normed"):
    margin = ln.margin(kind)  # [n_pairs, L + 1]; depth 0 is the embeddings, the last depth the reward
    depth = ln.crystallization(kind, fraction=0.5)  # first depth after which the margin stays ≥ half the final one
    curve = "  ".join(f"{m:+.2f}" for m in margin.mean(0))
    print(f"{kind:>6} lens, mean margin by depth: {curve}")
    print(f"        crystallization depth l/L per pair: {np.round(depth, 2).tolist()}, "
          f"median {np.nanmedian(depth):.2f}")
assert np.allclose(ln.linear[:, -1], ln.reward, atol=1e-4)  # the lens ends at the model's reward
