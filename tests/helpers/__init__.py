"""Helpers the tests share, imported as ``from tests.helpers import tiny`` (pytest runs from the repo root,
which `pythonpath` in pyproject.toml puts on ``sys.path``):

- `tiny`: random-init tiny reward models of every supported architecture, `ARCHS` and the shared `PAIRS`;
- `naive`: the naive patching yardstick (one full Hugging Face forward per part);
- `realmodels`: the real pretrained models (a shim over `rewardlens.zoo.realmodels`).
- `rewardbench`: rewardbench 0.1.4's RewardBench 2 rules (best-of-N ties, Ties), re-implemented as a yardstick.
"""
