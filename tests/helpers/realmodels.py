"""Real pretrained models for tests: a thin shim over `rewardlens.zoo.realmodels`.

The builders live in the package now (`rewardlens.zoo._realbuild`; the trained reward heads and the
dpo_en_demo pairs in `rewardlens.zoo.realmodels`). The folders, their names and their bytes are
unchanged: ``rewardlens.zoo._realbuild.cache_root()`` (``~/.cache/rewardlens/real-models`` unless
``$REWARDLENS_REAL_CACHE`` or the older ``$REWARDLENS_TEST_CACHE`` says otherwise) holds
``smollm2-135m-instruct-reward-v1/`` and ``all-minilm-l6-v2-reward-v1/`` (seeded heads: real
backbones, synthetic rewards, for testing the mechanics), and the trained-head folders
``smollm2-135m-instruct-dpo-<head sha>/`` and ``all-minilm-l6-v2-dpo-<head sha>/``.

Tests import it as ``from tests.helpers import realmodels`` (the repo root is on ``sys.path``);
``python -m tests.helpers.realmodels`` (from the repo root) builds the seeded folders ahead of time.
"""

from __future__ import annotations

import time

from rewardlens.zoo._realbuild import (  # noqa: F401  (re-exported for the tests)
    MINILM_DIRNAME,
    SMOLLM2_DIRNAME,
    cache_root,
    minilm_reward_dir,
    smollm2_reward_dir,
)
from rewardlens.zoo.realmodels import dpo_pairs, dpo_split, reward_model_dir  # noqa: F401


def smollm2_transcoders_dir(size: str = "small"):
    """SmolLM2's cached transcoders (scripts/train_real_transcoders.py, built once). The suite takes the "small"
    set (every layer, a few pairs, narrow: seconds to build on a clean machine); "full" is the findings' set."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "train_real_transcoders.py"
    spec = importlib.util.spec_from_file_location("train_real_transcoders", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.transcoders_dir(size)


if __name__ == "__main__":  # python -m tests.helpers.realmodels: build (or find) both and print paths
    for fn in (smollm2_reward_dir, minilm_reward_dir):
        t0 = time.monotonic()
        path = fn()
        print(f"{fn.__name__}: {path} ({time.monotonic() - t0:.1f}s)")

