import pytest
import torch
from transformers.utils import logging as hf_logging

from rewardlens.zoo import build_tokenizer
from tests.helpers import tiny

hf_logging.disable_progress_bar()  # save/load bars would bury pytest's own output
hf_logging.set_verbosity_error()
# The suite's models are tiny: one thread is as fast, and two threads spinning on a shared
# 2-core machine ran organism training and SAE tests 20-40x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("tiny")
    return {name: tiny.build(name, tokenizer, root) for name in tiny.ARCHS}


@pytest.fixture(scope="session")
def pairs():
    return tiny.PAIRS


@pytest.fixture(scope="session")
def organisms():
    """Every model organism at strength 1, plus the circuit and quality_list strength sweeps, trained once
    and cached on disk (under rewardlens.zoo._demo.cache_dir(), reused across runs): {(name, strength): folder}."""
    from rewardlens.calibrate import STRENGTHS
    from rewardlens.zoo.organisms import ORGANISMS, build

    sweeps = [(name, s) for name in ("circuit", "quality_list") for s in STRENGTHS if s != 1.0]
    keys = [(name, 1.0) for name in ORGANISMS] + sweeps
    return {key: build(key[0], strength=key[1]) for key in keys}


@pytest.fixture(scope="session")
def small_loop():
    """The closed loop's reduced config: the list organism, 2 seeds, 5 GRPO steps (every model cached on disk),
    run once per session for the loop's tests and the plot tests."""
    from rewardlens.loop import Recipe, verify_edit

    return verify_edit(("list",), seeds=(0, 1), recipe=Recipe(grpo_steps=5))
