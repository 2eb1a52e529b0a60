import functools
import inspect
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

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


class _TinyRoot(Mapping[str, Path]):
    """{arch: folder} of every tiny model, each built and saved on first use: the fast loop reads a handful."""

    def __init__(self, root: Path, tokenizer) -> None:
        self._root, self._tokenizer, self._built = root, tokenizer, {}

    def __getitem__(self, name: str) -> Path:
        if name not in tiny.ARCHS:
            raise KeyError(name)
        if name not in self._built:
            self._built[name] = tiny.build(name, self._tokenizer, self._root)
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(tiny.ARCHS)

    def __len__(self) -> int:
        return len(tiny.ARCHS)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory, tokenizer):
    return _TinyRoot(tmp_path_factory.mktemp("tiny"), tokenizer)


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
    from rewardlens.loop import PolicyRecipe, verify_edit

    return verify_edit(("list",), seeds=(0, 1), recipe=PolicyRecipe(grpo_steps=5))


# --- The fast inner loop: `pytest -m "not slow"` -------------------------------------------------------------
# One rule, held by code rather than by remembering to decorate: a test is slow when it (or a fixture it uses,
# or a function of its own module that either calls) trains an organism, a policy, an SAE or a transcoder (a
# `train`/`train_*` function of `TRAINERS`, however imported, or a TRL trainer), unpacks a real pretrained model
# (scripts/findings.py's pipeline runs two), drives a browser, executes a notebook, builds a wheel, or runs
# across processes (torchrun ranks, a child or server killed mid-run, a lock another process holds: each child
# imports torch again). An explicit `@pytest.mark.slow` marks one by hand.
# A sweep over the tiny architectures runs one per family in the loop (tests/helpers/tiny.py FAMILIES,
# `_arch_sweep_extras`); its other architectures are slow. CI runs everything; `pytest -m "not slow"` skips these.
SLOW_CALLS = re.compile(
    r"\borganisms\b|zoo\.organisms|\bverify_edit\b|\bsmall_loop\b|\btrain_sae\(|\btrain_transcoders\(|GRPO|"
    r"\btrl\.\w*Trainer\(|"
    r"\brealmodels\b|\bsmollm2_reward_dir\b|\bminilm_reward_dir\b|\breward_model_dir\(|\bload_reward_model\(|"
    r"\bscript\.findings\(|"
    r"torch\.distributed\.run|\bheld_by_another_process\(|\.send_signal\(|\.kill\(\)|"
    r"\bchromium\(|\bhelpers\.browser\b|\bdom\(|\bnbclient\b|\bpython -m build\b|\"build\", \"--wheel\"")


TRAINERS = ("rewardlens.zoo.organisms", "rewardlens.sae", "rewardlens.loop")
"""Packages whose `train` and `train_*` functions train a model (an organism, a PRM or DPO kind, an SAE, a policy)."""
BARE_CALL = re.compile(r"(?<![.\w])([A-Za-z_]\w*)\(")  # `train(` but not `model.train(`


def _trains(fn: object) -> bool:
    """Whether `fn`, a name a test calls, is one of the `TRAINERS`' training functions, however it was imported."""
    return (inspect.isfunction(fn) and (fn.__name__ == "train" or fn.__name__.startswith("train_"))
            and fn.__module__.startswith(TRAINERS))


@functools.cache
def _source(fn: object) -> str:
    try:
        return inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""


def _is_slow(item: pytest.Item) -> bool:
    """Whether the test's own code, its fixtures' code, or the module functions they call match SLOW_CALLS."""
    module = getattr(item, "module", None)
    todo = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        todo += [d.func for d in defs]
    seen: set[int] = set()
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        text = _source(fn)
        if SLOW_CALLS.search(text) or any(_trains(getattr(module, name, None)) for name in BARE_CALL.findall(text)):
            return True
        for name in re.findall(r"\b([A-Za-z_]\w*)\(", text):  # the module's own helpers it calls
            helper = getattr(module, name, None)
            if inspect.isfunction(helper) and helper.__module__ == getattr(module, "__name__", None):
                todo.append(helper)
    return False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: trains a model, unpacks a real one, drives a browser or builds a "
                                       "package (deselect with -m 'not slow'; CI runs everything)")


def _arch_of(item: pytest.Item) -> str | None:
    """The tiny architecture an item is parametrised over (by `parametrize` or a fixture's params), if exactly one."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    archs = [v for v in params.values() if isinstance(v, str) and v in tiny.FAMILY_OF]
    return archs[0] if len(archs) == 1 else None


def _sweep_key(item: pytest.Item, arch: str) -> tuple:
    """Items of one test that differ only in the architecture within one family share this key."""
    params = item.callspec.params  # type: ignore[attr-defined]
    rest = tuple(sorted((k, repr(v)) for k, v in params.items() if not (isinstance(v, str) and v == arch)))
    return item.path, item.cls, getattr(item, "originalname", item.name), rest, tiny.FAMILY_OF[arch]


def _arch_sweep_extras(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items of an architecture sweep beyond one per family: each family keeps its first member of
    `tiny.FAMILIES` when the test runs it, else the earliest in `tiny.FAMILIES` of those it runs."""
    sweeps: dict[tuple, list[tuple[pytest.Item, str]]] = {}
    for item in items:
        if (arch := _arch_of(item)) is not None:
            sweeps.setdefault(_sweep_key(item, arch), []).append((item, arch))
    extras = []
    for group in sweeps.values():
        order = tiny.FAMILIES[tiny.FAMILY_OF[group[0][1]]]
        keep = min(group, key=lambda pair: order.index(pair[1]))[0]
        extras += [item for item, _ in group if item is not keep]
    return extras


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.get_closest_marker("slow") and _is_slow(item):
            item.add_marker(pytest.mark.slow)
    for item in _arch_sweep_extras(items):
        item.add_marker(pytest.mark.slow)
