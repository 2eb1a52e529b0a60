"""Models to audit and to grade instruments on: the demo model, the built-in tokenizer, model organisms.

Nothing in an instrument imports this package; the real pretrained models are in `rewardlens.zoo.realmodels`.
"""

from ._builtin import CHATML as CHATML
from ._builtin import DEMO_PAIRS as DEMO_PAIRS
from ._builtin import build_tokenizer as build_tokenizer
from ._builtin import cache_dir as cache_dir
from ._demo import AUDIT_PAIRS as AUDIT_PAIRS
from ._demo import DEMO_ORGANISM as DEMO_ORGANISM
from ._demo import demo_model_dir as demo_model_dir

__all__ = [
    "AUDIT_PAIRS",
    "CHATML",
    "DEMO_ORGANISM",
    "DEMO_PAIRS",
    "build_tokenizer",
    "cache_dir",
    "demo_model_dir",
]
