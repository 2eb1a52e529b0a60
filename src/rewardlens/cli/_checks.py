"""The checks every command shares, standard library only: paths, and the model options a folder's
config.json can refute, all before torch or transformers is imported (`check_common`); and the one
check that needs torch, of `--device`, run once torch is imported and before the model loads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from ..errors import UsageError


class ArgumentError(UsageError):
    """A path or option the command cannot use; found before anything heavy is imported (the message names
    the flag itself)."""


# ---- path checks: standard library only ----------------------------------------------------------

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
"""`org/name`: a path that does not exist locally but may name a Hugging Face hub repository."""
MODEL_OPTIONS = ("model", "other", "dpo_reference")
"""Options holding a model folder or hub id, checked by `check_common`."""
PAIRS_OPTIONS = ("pairs", "reference", "background", "probe_pairs")
"""Options holding a pairs file or dataset folder, checked by `check_common`."""
PATH_OPTIONS = {"model": "MODEL", "other": "OTHER", "dpo_reference": "--dpo-reference", "against": "--against",
                "pairs": "--pairs", "reference": "--reference", "background": "--background",
                "probe_pairs": "--probe-pairs", "out": "--out", "store": "--store", "sae": "--sae",
                "cache": "--cache", "offload_folder": "--offload-folder", "log": "LOG"}
"""Every option holding a path (or hub id), as a user types it: none may be empty (`check_path_text`)."""


def check_path_text(path: str, what: str) -> None:
    """Refuse a path no file can have: "" (which resolves to the current folder, so `--out ""` would write
    into it) or one holding a NUL byte (which the OS cannot take)."""
    if not path:
        raise ArgumentError(f"{what} {path!r} is empty, and an empty path means the current folder; name the file "
                            "or folder (use . to mean the current folder)")
    if "\0" in path:
        raise ArgumentError(f"{what} {path!r} holds a NUL byte, which no path can hold; retype it")


def check_model(path: str) -> None:
    """A model folder with a config.json, or a plausible hub id (`org/name`) that is not a local path."""
    check_path_text(path, "model folder")
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ArgumentError(f"not a model folder (no config.json in it): {path}")
    elif p.exists():
        raise ArgumentError(f"not a model folder (it is a file): {path}")
    elif not _HUB_ID.fullmatch(path):
        raise ArgumentError(f"no such model folder: {path}")


def check_input(path: str, what: str = "file") -> None:
    """A file (or dataset folder) that exists and can be read."""
    check_path_text(path, what)
    p = Path(path).expanduser()
    if not p.exists():
        raise ArgumentError(f"no such {what}: {path}")
    if not os.access(p, os.R_OK):
        raise ArgumentError(f"cannot read {what}: {path}")


def check_folder(path: str, what: str = "folder") -> None:
    """An input folder that exists."""
    check_path_text(path, what)
    if not Path(path).expanduser().is_dir():
        raise ArgumentError(f"no such {what}: {path}")


def check_out_folder(path: str, what: str = "output folder") -> None:
    """A folder that exists and is writable, or one that can be created (its nearest existing parent is)."""
    check_path_text(path, what)
    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise ArgumentError(f"{what} is a file, not a folder: {path}")
    _check_writable(p, path, what)


def check_out_file(path: str, what: str = "output file") -> None:
    """A file that can be written: not a folder, and in a folder that exists or can be created."""
    check_path_text(path, what)
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        raise ArgumentError(f"{what} is a folder, not a file: {path}")
    if p.exists() and not os.access(p, os.W_OK):
        raise ArgumentError(f"cannot write {what}: {path}")
    _check_writable(p.parent, path, what)


def _check_writable(folder: Path, shown: str, what: str) -> None:
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ArgumentError(f"cannot create {what} {shown}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArgumentError(f"cannot write to {what}: {shown} ({existing} is not writable)")
    try:  # permission bits say nothing of /proc, a read-only mount, or root: create (and drop) a file there
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise ArgumentError(f"cannot write to {what}: {shown} ({existing} takes no new files: "
                            f"{e.strerror or e})") from None


def check_common(args: argparse.Namespace) -> None:
    """The checks every command shares, before anything heavy is imported: no empty path, model paths,
    pairs files, and the model options that a folder's config.json can refute (`check_model_options`)."""
    for name, shown in PATH_OPTIONS.items():
        value = getattr(args, name, None)
        if isinstance(value, str):
            check_path_text(value, shown)
    for name in MODEL_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            check_model(value)
    for name in PAIRS_OPTIONS:
        value = getattr(args, name, None)
        if value:
            check_input(value, f"--{name.replace('_', '-')} file")
    check_model_options(args)


# ---- model options a folder's config.json can refute: standard library only ----------------------

_DEVICE = re.compile(r"[a-z][a-z0-9_]*(:[0-9]+)?")
"""How torch spells a device: a type, optionally `:index` (torch itself says which types exist)."""
_CLASSIFIERS = ("ForSequenceClassification", "LlamaForRewardModelWithGating")
"""Endings of the `architectures` a sequence-classification reward model is saved as (ArmoRM's class too)."""
_KIND_FLAGS = {
    "prm_separator": ("reads a process RM's steps from a token-classification head (or, with --prm-tokens, "
                      "an LM head)", "a PRM's folder (…ForTokenClassification or …ForCausalLM)"),
    "judge_tokens": ("reads an LLM judge's answer-token log-odds from its LM head", "a judge's folder (…ForCausalLM)"),
    "dpo_reference": ("reads a DPO policy's implicit reward from its LM head", "the policy's folder (…ForCausalLM)"),
}
"""What each reward-kind flag asks of the model folder's head, and the folder that has such a head."""


def model_config(path: str) -> dict[str, Any] | None:
    """The parsed config.json of a local model folder; None for a hub id, or one the loader must judge."""
    try:
        config = json.loads((Path(path).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def check_model_options(args: argparse.Namespace) -> None:
    """`--device`, `--device-map`, `--offload-folder`, `--pad-token-id` and the kind flags, checked against
    each other and against the model folder's config.json (when local), before the model loads."""
    device, device_map = getattr(args, "device", None), getattr(args, "device_map", None)
    if device is not None and not _DEVICE.fullmatch(device):
        raise ArgumentError(f"--device {device!r} is not a device name; pass cpu, cuda, cuda:N, mps or another "
                            "device torch knows (TYPE or TYPE:INDEX)")
    if device_map is not None and not device_map.strip():
        raise ArgumentError("--device-map '' is empty; pass auto (or balanced, sequential), or drop --device-map")
    if getattr(args, "offload_folder", None) is not None and device_map is None:
        raise ArgumentError("--offload-folder is where --device-map puts weights it offloads to disk, and "
                            "--device-map was not given; pass --device-map auto too, or drop --offload-folder")
    pad = getattr(args, "pad_token_id", None)
    if pad is not None and pad < 0:
        raise ArgumentError(f"--pad-token-id {pad} is not a token id (ids count from 0); pass the id of the pad "
                            "token, or drop --pad-token-id to read by the model's own")
    model, reference = getattr(args, "model", None), getattr(args, "dpo_reference", None)
    if isinstance(model, str) and (config := model_config(model)) is not None:
        check_pad_in_vocab(pad, config, model)
        _check_kind_fits(args, config, model)
    if isinstance(reference, str) and (config := model_config(reference)) is not None:
        _check_kind_fits(args, config, reference, "dpo_reference")


def vocab_size(config: dict[str, Any]) -> int | None:
    """The vocabulary size a config.json states (a multimodal model's in its `text_config`), else None."""
    size = config.get("vocab_size")
    text = config.get("text_config")
    if not isinstance(size, int) and isinstance(text, dict):
        size = text.get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def check_pad_in_vocab(pad: int | None, config: dict[str, Any], model: str) -> None:
    """Refuse a `--pad-token-id` the embedding has no row for: the forward would fail in torch.embedding."""
    size = vocab_size(config)
    if pad is not None and size is not None and pad >= size:
        raise ArgumentError(f"--pad-token-id {pad} is not a token id of {model}: its vocabulary has {size} ids "
                            f"(0 to {size - 1}, config.json vocab_size); pass an id in that range, or drop "
                            "--pad-token-id to read by the model's own")


def _check_kind_fits(args: argparse.Namespace, config: dict[str, Any], model: str, only: str | None = None) -> None:
    """Refuse a reward-kind flag that asks for a head the folder's architecture has not: a sequence
    classifier holds one pooled score, no LM head and no per-token scores (docs/rm-kinds.md)."""
    saved = [a for a in config.get("architectures") or () if isinstance(a, str)]
    if not saved or not all(a.endswith(_CLASSIFIERS) for a in saved):
        return
    for name, (reads, folder) in _KIND_FLAGS.items():
        if getattr(args, name, None) is not None and only in (None, name):
            flag = "--" + name.replace("_", "-")
            fix = (f"drop {flag} to score it as one, or point at {folder}" if only is None else
                   "point --dpo-reference at the reference language model (…ForCausalLM)")
            raise ArgumentError(f"{flag} {reads}, but {model} holds a sequence-classification reward model "
                                f"({saved[0]} in its config.json), which has no such head; {fix}")


def check_device_parses(device: str | None) -> None:
    """Refuse a `--device` torch cannot parse (`tpu`), after torch is imported and before the model loads;
    whether the device exists is the loader's check (`rewardlens.load` names what this machine has)."""
    if device is None:
        return
    import torch

    try:
        torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ArgumentError(f"--device {device!r} is not a device torch knows ({' '.join(str(e).split())}); pass "
                            "cpu, cuda, cuda:N, mps or another type torch lists") from None
