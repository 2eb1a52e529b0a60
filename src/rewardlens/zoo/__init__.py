"""Models to audit and to grade instruments on: the demo model, the built-in tokenizer, model organisms.

Nothing in an instrument imports this package; the real pretrained models are in `rewardlens.zoo.realmodels`.
Where built artifacts are cached (`cache_dir`) is `rewardlens.zoo.internal`.
"""

from .._deprecated import moved as _moved
from ._builtin import CHATML as CHATML
from ._builtin import DEMO_PAIRS as DEMO_PAIRS
from ._builtin import build_tokenizer as build_tokenizer
from ._demo import AUDIT_PAIRS as AUDIT_PAIRS
from ._demo import DEMO_ORGANISM as DEMO_ORGANISM
from ._demo import demo_model_dir as demo_model_dir

# Moved to `rewardlens.zoo.internal` (0.2, issue 43 item 3); the old name works for one release.
__getattr__ = _moved(__name__, {"cache_dir": "rewardlens.zoo.internal"})

__all__ = [
    "AUDIT_PAIRS",
    "CHATML",
    "DEMO_ORGANISM",
    "DEMO_PAIRS",
    "build_tokenizer",
    "demo_model_dir",
]
