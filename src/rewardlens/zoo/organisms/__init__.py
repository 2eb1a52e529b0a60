"""Model organisms: tiny reward models with planted rules, the ground truth instruments are graded on.

```python
from rewardlens.zoo.organisms import ORGANISMS, build
path = build("list", strength=1.0, seed=0)        # trained once, cached; rewardlens.load(path) opens it
spec = ORGANISMS["list"]
pairs = spec.pairs(n=200, seed=1, strength=1.0)   # rewardlens.Pair list; each seed gives new pairs
spec.has_attribute(pairs[0].chosen)               # True: the chosen side carries the planted attribute
spec.planted_part                                 # "attn_L1_H2" for "circuit", None for the others
ORGANISMS["two_step"].planted_path                # ("attn_L0_H1", "attn_L1_H2"): a rule needing both, in series
```
`KINDS` holds organisms of other reward-model kinds, built and cached the same way: "prm_steps" (a
process reward model, `open_kind(build("prm_steps"))` or `rewardlens.model.load_prm(path, separator="\n")`)
and "dpo_keyword" (a DPO policy and its reference, `rewardlens.model.load_dpo(*dpo_paths(path))`).
See docs/organisms.md for each rule, the strength dial and the measured accuracy.
"""

from ..._deprecated import moved as _moved
from . import _bank as bank
from ._cache import build as build
from ._cache import record as record
from ._dpo import PolicyOrganism as PolicyOrganism
from ._dpo import implicit_rewards as implicit_rewards
from ._kinds import KINDS as KIND_ORGANISMS
from ._kinds import dpo_paths as dpo_paths
from ._kinds import open_kind as open_kind
from ._prm import StepOrganism as StepOrganism
from ._prm import prm_accuracy as prm_accuracy
from ._prm import step_scores as step_scores
from ._specs import ORGANISMS as ORGANISMS
from ._specs import Organism as Organism
from ._specs import RMRecipe as RMRecipe
from ._train import ablated as ablated
from ._train import forward_margins as forward_margins

# Renamed in 0.2 (docs/design.md "Words"), or the cache's plumbing moved to `internal` (issue 43 item 3); the old
# names work for one release.
__getattr__ = _moved(__name__, {"KINDS": "rewardlens.zoo.organisms:KIND_ORGANISMS",
                                "Recipe": "rewardlens.zoo.organisms:RMRecipe",
                                **dict.fromkeys(("ORGANISM_VERSION", "READY", "built_once", "locked", "organism_dir"),
                                                "rewardlens.zoo.organisms.internal")})

__all__ = ["KIND_ORGANISMS", "ORGANISMS", "Organism", "PolicyOrganism", "RMRecipe", "StepOrganism", "ablated", "bank",
           "build", "dpo_paths", "forward_margins", "implicit_rewards", "open_kind", "prm_accuracy", "record",
           "step_scores"]
