"""Model organisms: tiny reward models with planted rules, the ground truth instruments are graded on.

```python
from rewardlens.zoo.organisms import ORGANISMS, build
path = build("list", strength=1.0, seed=0)        # trained once, cached; rewardlens.load(path) opens it
spec = ORGANISMS["list"]
pairs = spec.pairs(n=200, seed=1, strength=1.0)   # rewardlens.Pair list; each seed gives new pairs
spec.has_attribute(pairs[0].chosen)               # True: the chosen side carries the planted attribute
spec.planted_part                                 # "attn_L1_H2" for "circuit", None for the others
```
See docs/organisms.md for each rule, the strength dial and the measured accuracy.
"""

from . import _bank as bank
from ._cache import READY as READY
from ._cache import VERSION as VERSION
from ._cache import build as build
from ._cache import locked as locked
from ._cache import organism_dir as organism_dir
from ._cache import record as record
from ._specs import ORGANISMS as ORGANISMS
from ._specs import Organism as Organism
from ._specs import Recipe as Recipe
from ._train import ablated as ablated
from ._train import forward_margins as forward_margins

__all__ = ["ORGANISMS", "READY", "VERSION", "Organism", "Recipe", "ablated", "bank", "build", "forward_margins",
           "locked", "organism_dir", "record"]
