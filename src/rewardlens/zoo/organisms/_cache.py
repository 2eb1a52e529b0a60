"""`build`: train an organism once and cache it as a plain Hugging Face folder.

Layout: `cache_dir()/organisms/{name}-s{strength}-seed{seed}-{ORGANISM_VERSION}/` holding config.json,
model.safetensors, the tokenizer files, `organism.json` (what was trained and how well it does)
and `READY`, written last. A build happens in a temporary folder renamed into place under an
`fcntl` lock, so concurrent processes never see half a folder or train the same organism twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...errors import UsageError
from .._builtin import cache_dir
from ._kinds import KINDS
from ._specs import ORGANISMS

ORGANISM_VERSION = "v1"
"""Bump whenever data, recipe or model change, so stale cached organisms are not reused."""
READY = "READY"
RECORD = "organism.json"


def organism_dir(name: str, strength: float = 1.0, seed: int = 0) -> Path:
    """Where `build(name, strength, seed)` keeps its folder (whether or not it exists yet)."""
    return cache_dir() / "organisms" / f"{name}-s{strength:g}-seed{seed}-{ORGANISM_VERSION}"


def build(name: str, strength: float = 1.0, seed: int = 0) -> Path:
    """Train organism `name` at planted `strength` from `seed` (once; cached) and return its folder.

    `rewardlens.load(path)` opens the folder (multi-objective organisms need `readout=`).
    Deterministic: the same arguments give the same data and the same weights on a given
    torch build and CPU (its float kernels: AVX-512 and AVX2 give weights ~11 % apart). Takes
    5–20 s on one CPU core the first time.
    """
    if name not in ORGANISMS and name not in KINDS:
        raise UsageError(f"no organism named {name!r}; choose one of {sorted(ORGANISMS)} or {sorted(KINDS)}")
    if not 0.0 <= strength <= 1.0:
        raise UsageError(f"strength is the share of pairs the rule decides, in [0, 1]; got {strength}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    train = _train_kind_into if name in KINDS else _train_into
    return built_once(organism_dir(name, strength, seed), lambda work: train(work, name, strength, seed))


def built_once(final: Path, make: Callable[[Path], None]) -> Path:
    """`final`, built once across processes: `make(work)` fills a temporary folder beside it, which
    gets `READY` (unless `make` wrote its own, last) and is renamed into place under `locked`, so no
    process ever sees half a folder or builds the same one twice. A folder without `READY` (an
    interrupted build) and a killed build's temporary folders are removed first, under the lock."""
    if (final / READY).is_file():  # fast path, no lock
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with locked(final.parent / f"{final.name}.lock"):
        if (final / READY).is_file():  # another process built it while we waited
            return final
        if final.exists():
            shutil.rmtree(final)
        for stale in final.parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            make(work)
            if not (work / READY).is_file():
                (work / READY).write_text("ok\n")
            os.rename(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What `build` wrote about an organism folder: name, strength, seed, version, the training
    time and the held-out pair accuracy per objective."""
    file = Path(path) / RECORD
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist; pass a folder made by rewardlens.zoo.organisms.build")
    return json.loads(file.read_text())


def _train_into(folder: Path, name: str, strength: float, seed: int) -> None:
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    from ._train import train

    spec = ORGANISMS[name]
    model, tok, stats = train(spec, strength, seed)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "writing shards" bar per organism would clutter test and CLI output
    try:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    stats.update(version=ORGANISM_VERSION, rule=spec.rule, objectives=list(spec.objectives),
                 planted_part=spec.planted_part, planted_path=spec.planted_path,
                 torch=torch.__version__, transformers=transformers.__version__)
    (folder / RECORD).write_text(json.dumps(stats, indent=2) + "\n")
    for f in folder.iterdir():  # save_pretrained writes 0600 files; let a shared cache be read
        f.chmod(0o644)
    folder.chmod(0o755)
    (folder / READY).write_text("ok\n")


def _train_kind_into(folder: Path, name: str, strength: float, seed: int) -> None:
    """`_train_into` for a PRM or DPO organism (`KINDS`): its module trains and saves it (a DPO
    organism as two subfolders); the record, permissions and READY are written here as for the rest."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    from ._kinds import train_kind_into

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        stats = train_kind_into(folder, name, strength, seed)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    stats.update(version=ORGANISM_VERSION, torch=torch.__version__, transformers=transformers.__version__)
    (folder / RECORD).write_text(json.dumps(stats, indent=2) + "\n")
    for f in folder.rglob("*"):  # save_pretrained writes 0600 files; let a shared cache be read
        f.chmod(0o755 if f.is_dir() else 0o644)
    folder.chmod(0o755)
    (folder / READY).write_text("ok\n")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive file lock on `path` (POSIX) while building something other processes wait for."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock; the rename still keeps half-built folders out of sight
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
