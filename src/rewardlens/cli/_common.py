"""What every command shares: model and pairs options, loading from them, tables, errors."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..data import Pair, load_pairs
from ..errors import RewardLensError
from ..model import RewardModel, load

_Number = TypeVar("_Number", int, float)


@dataclass(frozen=True)
class Command:
    """One subcommand: its options, what it computes (a JSON-ready dict) and how it prints."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict[str, Any]]
    show: Callable[[dict[str, Any]], None]
    exit_code: Callable[[dict[str, Any]], int] = lambda result: 0
    """Status to exit with once the result is printed (e.g. 1 when a check failed)."""


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (floats with 4 decimals)."""
    cells = [[f"{c:+.4f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda xs: "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(xs, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def finite(x: float) -> float | None:
    """A float for JSON, or None where it is NaN or infinite (JSON has no NaN)."""
    return float(x) if np.isfinite(x) else None


def pair_id(pair: Pair, i: int) -> str:
    return pair.id if pair.id is not None else str(i)


def positive(kind: Callable[[str], _Number]) -> Callable[[str], _Number]:
    """An argparse `type=` that parses with `kind` (int or float) and refuses values <= 0."""

    def parse(text: str) -> _Number:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _readout(text: str) -> int | str | list[float]:
    """'2' → index 2, 'helpfulness' → a label, '1,-1' → one weight per head output."""
    if "," in text:
        return [float(x) for x in text.split(",")]
    return int(text) if text.lstrip("-").isdigit() else text


def add_model_options(p: argparse.ArgumentParser, *, optional_model: bool = False) -> None:
    """The model positional and the options `rewardlens.load` takes."""
    p.add_argument("model", nargs="?" if optional_model else None,
                   help="model folder or hub id" + (" (default: the built-in demo model)" if optional_model else ""))
    p.add_argument("--batch-size", type=positive(int), default=8)
    p.add_argument("--dtype", default=None, help="e.g. bfloat16; head and reductions stay fp32")
    p.add_argument("--device", default=None)
    p.add_argument("--device-map", default=None,
                   help="e.g. auto: split a model too big for one device across GPUs, CPU and disk (accelerate)")
    p.add_argument("--offload-folder", default=None, help="with --device-map: where weights offloaded to disk go")
    p.add_argument("--readout", type=_readout, default=None,
                   help="multi-output heads: an objective index, a label, or comma-separated weights")
    p.add_argument("--pad-token-id", type=int, default=None, help="read by this pad id instead of the model's")
    p.add_argument("--max-length", type=positive(int), default=None)
    p.add_argument("--truncation", choices=["error", "left"], default="error")
    p.add_argument("--trust-remote-code", action="store_true")


def add_pairs_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--pairs", required=required,
                   help="preference pairs (JSONL, JSON, CSV, Parquet, HF dataset folder)")
    p.add_argument("--limit", type=positive(int), default=None, help="use only the first N pairs")


def load_model(args: argparse.Namespace) -> RewardModel:
    """`rewardlens.load` with the options of `add_model_options`."""
    extra: dict[str, Any] = {"pad_token_id": args.pad_token_id} if args.pad_token_id is not None else {}
    if args.trust_remote_code:
        extra["trust_remote_code"] = True
    if args.offload_folder is not None:
        extra["offload_folder"] = args.offload_folder
    return load(args.model, dtype=args.dtype, device=args.device, device_map=args.device_map, readout=args.readout,
                max_length=args.max_length, truncation=args.truncation, **extra)


def read_pairs(args: argparse.Namespace) -> list[Pair]:
    if not args.pairs:
        raise RewardLensError("--pairs FILE is required when a model is given")
    return load_pairs(args.pairs, limit=args.limit)
