import sys
from pathlib import Path

import pytest
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).parent))
hf_logging.disable_progress_bar()  # save/load bars would bury pytest's own output
hf_logging.set_verbosity_error()

import tiny  # noqa: E402

from rewardlens import Pair  # noqa: E402
from rewardlens.demo import build_tokenizer  # noqa: E402

ARCHS = list(tiny.configs(build_tokenizer()).keys())

PAIRS = [
    Pair("What is the capital of France?", "The capital of France is Paris.", "France is in Europe."),
    Pair("How do I boil an egg?", "Place the egg in boiling water for nine minutes, then cool it.", "Eggs."),
    Pair([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 times 12?"}],
         "144.", "12 times 12 is 124, I am quite sure about that."),
]


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("tiny")
    return {name: tiny.build(name, tokenizer, root) for name in ARCHS}


@pytest.fixture(scope="session")
def pairs():
    return PAIRS
