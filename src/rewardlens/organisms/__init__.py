"""Model organisms: tiny reward models with planted rules, the ground truth instruments are graded on.

```python
from rewardlens.organisms import ORGANISMS, build
path = build("list", strength=1.0, seed=0)        # trained once, cached; rewardlens.load(path) opens it
spec = ORGANISMS["list"]
pairs = spec.pairs(n=200, seed=1, strength=1.0)   # rewardlens.Pair list; each seed gives new pairs
spec.has_attribute(pairs[0].chosen)               # True: the chosen side carries the planted attribute
spec.planted_part                                 # "attn_L1_H2" for "circuit", None for the others
```
See docs/organisms.md for each rule, the strength dial and the measured accuracy.
"""

from .cache import VERSION as VERSION
from .cache import build as build
from .cache import organism_dir as organism_dir
from .cache import record as record
from .specs import ORGANISMS as ORGANISMS
from .specs import Organism as Organism
from .specs import Recipe as Recipe

__all__ = ["ORGANISMS", "VERSION", "Organism", "Recipe", "build", "organism_dir", "record"]
