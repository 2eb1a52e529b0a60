"""Fixtures the command-line tests share."""

import pytest

from rewardlens.data import save_pairs
from rewardlens.zoo import DEMO_PAIRS


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory):
    """The demo pairs as a JSONL file, for `--pairs`."""
    return str(save_pairs(DEMO_PAIRS, tmp_path_factory.mktemp("cli") / "pairs.jsonl"))
