"""What every command shares: model and pairs options, loading, tables, errors (the path and option
checks live in `_checks`, their names re-exported here).

Only the standard library is imported here (and by every command module at import time): the
parser, its value checks and the path checks run before torch or transformers is imported,
so a mistyped path or option is refused at once. The heavy imports happen inside each command's
run function.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ._checks import ArgumentError as ArgumentError
from ._checks import check_common as check_common
from ._checks import check_device_parses
from ._checks import check_folder as check_folder
from ._checks import check_input as check_input
from ._checks import check_model as check_model
from ._checks import check_out_file as check_out_file
from ._checks import check_out_folder as check_out_folder

if TYPE_CHECKING:
    from ..data import Pair
    from ..model import RewardModel

_Number = TypeVar("_Number", int, float)

DTYPES = ("auto", "bf16", "bfloat16", "float16", "float32", "fp16", "fp32", "half")
"""The `--dtype` names `rewardlens.load` accepts (tests/cli checks them against the loader's)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with the one line to print about what was kept and how to go on."""


def _keep(args: argparse.Namespace) -> None:
    """No checks beyond the common ones."""


@dataclass(frozen=True)
class Command:
    """One subcommand: its options, what it computes (a JSON-ready dict) and how it prints."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict[str, Any]]
    show: Callable[[dict[str, Any]], None]
    exit_code: Callable[[dict[str, Any]], int] = lambda _result: 0  # by default, success whatever the result
    """Status to exit with once the result is printed (e.g. 1 when a check failed)."""
    check: Callable[[argparse.Namespace], None] = _keep
    """Path checks of this command's own options (stdlib only), after `check_common`."""


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (floats with 4 decimals)."""
    cells = [[f"{c:+.4f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda xs: "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(xs, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def finite(x: float) -> float | None:
    """A float for JSON, or None where it is NaN or infinite (JSON has no NaN): `stats.json_number`.
    Imported on call: only run functions call it, after the heavy imports."""
    from ..stats import json_number

    return json_number(x)


def print_json(result: dict[str, Any]) -> None:
    """`--json`: the result as strict JSON, NaN and inf as null (`stats.to_json`, the one JSON writer)."""
    from ..stats import to_json

    print(to_json(result, indent=2))


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


BUILT_IN_ITEMS = 72
"""How many built-in probe items there are (`len(rewardlens.hacking.ITEMS)`, not imported here so that a bad
argument fails before the instruments load; tests/cli checks the two agree)."""

PROBE_STAGES = (18, 36, 72)
"""The staged budget's item counts, for the help text (`rewardlens.hacking.STAGES`; tests/cli checks the two agree)."""


def add_probe_items_option(p: argparse.ArgumentParser, what: str) -> None:
    """`--probe-items` for a command whose `what` (the probes, or the probes and concepts) reads built-in items:
    a count or 'all'; `check_probe_items` then bounds it."""
    p.add_argument("--probe-items", type=_probe_items, default=None,
                   help=f"{what} on N of the {BUILT_IN_ITEMS} built-in items (a fixed budget), or 'all'; default: "
                        f"stages of {', '.join(map(str, PROBE_STAGES))} items, stopping once every axis is decided "
                        "(docs/probes.md)")


def _probe_items(text: str) -> int:
    """`--probe-items`: 'all' (any case: every built-in item, `BUILT_IN_ITEMS`) or a positive count."""
    if text.strip().lower() == "all":
        return BUILT_IN_ITEMS
    return positive(int)(text)


def check_probe_items(args: argparse.Namespace, floor: str) -> None:
    """Refuse a `--probe-items` count under 2 (`floor`: why the command needs two, for the message); clamp (with
    a word) one over the built-in items, which would otherwise fail only once the model had loaded."""
    n = args.probe_items
    if n is None:
        return
    if n < 2:
        raise ArgumentError(f"--probe-items {n} is under 2, {floor}; pass 2 to "
                            f"{BUILT_IN_ITEMS}, 'all', or drop --probe-items for the staged budget")
    if n > BUILT_IN_ITEMS:
        print(f"rewardlens: --probe-items {n} > the {BUILT_IN_ITEMS} built-in items: using all {BUILT_IN_ITEMS}",
              file=sys.stderr)
        args.probe_items = BUILT_IN_ITEMS  # all of them: the run (and its store keys) of --probe-items all


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _readout(text: str) -> int | str | list[float]:
    """'2' → index 2, 'helpfulness' → a label, '1,-1' → one weight per head output."""
    if "," in text:
        try:
            return [float(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an index, a label or comma-separated weights, "
                                             f"got {text!r}") from None
    return int(text) if text.lstrip("-").isdigit() else text


def add_model_options(p: argparse.ArgumentParser, *, optional_model: bool = False) -> None:
    """The model positional and the options `rewardlens.load` takes."""
    p.add_argument("model", nargs="?" if optional_model else None,
                   help="model folder or hub id" + (" (default: the built-in demo model)" if optional_model else ""))
    p.add_argument("--batch-size", type=positive(int), default=8)
    p.add_argument("--dtype", choices=DTYPES, default=None, help="backbone dtype; head and reductions stay fp32")
    p.add_argument("--device", default=None)
    p.add_argument("--device-map", default=None,
                   help="e.g. auto: split a model too big for one device across GPUs, CPU and disk (accelerate)")
    p.add_argument("--offload-folder", default=None, help="with --device-map: where weights offloaded to disk go")
    p.add_argument("--readout", type=_readout, default=None,
                   help="multi-output heads: an objective index, a label, or comma-separated weights")
    p.add_argument("--pad-token-id", type=int, default=None, help="read by this pad id instead of the model's")
    p.add_argument("--max-length", type=positive(int), default=None)
    p.add_argument("--truncation", choices=["error", "left"], default="error")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the custom code a model folder's config.json names (auto_map); read it first")
    p.add_argument("--allow-pickle", action="store_true",
                   help="load pickle-only weights (pytorch_model.bin); refused by default: unpickling runs code")
    kind = p.add_argument_group("reward-model kind (docs/rm-kinds.md; default: a sequence classifier)")
    kind.add_argument("--prm-separator", type=_escaped, default=None,
                      help="a process RM: read every step at this separator token (escapes allowed: '\\n')")
    kind.add_argument("--prm-combine", choices=["sum", "mean", "min", "last"], default=None,
                      help="with --prm-separator: how step scores make the sequence's reward (default min)")
    kind.add_argument("--prm-tokens", type=_two_tokens, default=None,
                      help="with --prm-separator: read the LM head's log-odds of these two tokens, e.g. '+,-'")
    kind.add_argument("--judge-tokens", type=_two_tokens, default=None,
                      help="an LLM judge: the log-odds of two answer tokens, e.g. 'Yes,No'")
    kind.add_argument("--dpo-reference", default=None,
                      help="a DPO policy: its implicit reward against this reference model (folder or hub id)")
    kind.add_argument("--dpo-beta", type=positive(float), default=None,
                      help="with --dpo-reference: DPO's beta (default 0.1)")


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def _escaped(text: str) -> str:
    """A separator as typed on a command line, with the escapes \\n, \\t, \\r and \\\\ turned into characters;
    everything else, non-ASCII step tags such as Math-Shepherd's 'ки' included, stays as typed."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


def _two_tokens(text: str) -> tuple[str, str]:
    parts = text.split(",")
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected two tokens separated by a comma, e.g. 'Yes,No'; got {text!r}")
    return parts[0], parts[1]


def add_pairs_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--pairs", required=required,
                   help="preference pairs (JSONL, JSON, CSV, Parquet, HF dataset folder)")
    p.add_argument("--limit", type=positive(int), default=None, help="use only the first N pairs")
    add_strict_option(p)


def add_strict_option(p: argparse.ArgumentParser) -> None:
    """`--strict`, for every command that reads pairs files: `pairs_file` passes it to `load_pairs`."""
    p.add_argument("--strict", action="store_true",
                   help="refuse degenerate pairs (empty responses, identical sides, duplicate ids, repeated pairs) "
                        "instead of warning")


FLAGS = {
    "readout": "--readout", "max_length": "--max-length", "pad_token_id": "--pad-token-id",
    "truncation": "--truncation", "batch_size": "--batch-size", "dtype": "--dtype", "device": "--device",
    "device_map": "--device-map", "offload_folder": "--offload-folder", "trust_remote_code": "--trust-remote-code",
    "allow_pickle": "--allow-pickle",
    "strict": "--strict", "limit": "--limit", "chunk_size": "--chunk-size", "probe_items": "--probe-items",
    "sae_layer": "--sae-layer", "layer": "--layer", "positions": "--positions", "estimand": "--estimand",
    "fraction": "--fraction", "n_boot": "--n-boot", "seed": "--seed", "k": "--k", "expansion_factor":
    "--expansion-factor", "num_latents": "--latents", "min_effect": "--min-effect", "mode": "--mode",
    "ablation": "--ablation", "divergence": "--divergence", "level": "--level", "neurons": "--neurons",
    "transcoders": "--transcoders",
}
"""The one table from the option a rewardlens error carries (`RewardLensError.option`, a Python keyword) to the
flag a command-line user passes: `cli.failed` names the flag from it, so no message is parsed."""


def command_line(argv: Sequence[str] | None) -> str:
    """The command line this process was started with (to repeat it), as a shell would read it."""
    if argv is not None:
        return shlex.join(["rewardlens", *argv])
    first = Path(sys.argv[0])
    if first.name in ("__main__.py", "__init__.py"):  # python -m rewardlens / python -m rewardlens.cli
        module = "rewardlens.cli" if first.parent.name == "cli" else "rewardlens"
        return shlex.join([sys.executable, "-m", module, *sys.argv[1:]])
    return shlex.join(sys.argv)


# ---- loading: imports the heavy modules, so only from inside a run function --------------------

def quiet_hub() -> None:
    """No weight-loading bars: they would interleave with the table."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_model(args: argparse.Namespace) -> RewardModel:
    """`rewardlens.load` with the options of `add_model_options`. transformers says that a folder or hub id
    cannot be loaded (not found, no network, no config) with a bare `OSError`: bad input, one line, exit 2."""
    from ..errors import ModelLoadError

    try:
        return _load_model(args)
    except OSError as e:
        if e.errno is not None or e.filename is not None:
            raise  # a file's own error (missing, unreadable): its message names the file
        raise ModelLoadError(f"{args.model}: {' '.join(str(e).split())}") from e


def _load_model(args: argparse.Namespace) -> RewardModel:
    quiet_hub()
    check_device_parses(getattr(args, "device", None))  # torch is imported now: it parses its own names
    from ..model import load, load_dpo, load_judge, load_prm

    extra: dict[str, Any] = {"pad_token_id": args.pad_token_id} if args.pad_token_id is not None else {}
    if args.trust_remote_code:
        extra["trust_remote_code"] = True
    if getattr(args, "allow_pickle", False):
        extra["allow_pickle"] = True
    if args.offload_folder is not None:
        extra["offload_folder"] = args.offload_folder
    common = dict(dtype=args.dtype, device=args.device, max_length=args.max_length, truncation=args.truncation)
    kinds = [k for k in ("prm_separator", "judge_tokens", "dpo_reference") if getattr(args, k, None) is not None]
    if len(kinds) > 1:
        raise ArgumentError(f"--{kinds[0].replace('_', '-')} and --{kinds[1].replace('_', '-')} name two kinds of "
                            "reward model; pass one")
    if kinds and (args.device_map is not None or args.pad_token_id is not None):
        raise ArgumentError("--device-map and --pad-token-id are for sequence-classification reward models")
    _refuse_orphans(args, kinds[0] if kinds else None)
    if getattr(args, "dpo_reference", None) is not None:
        beta = 0.1 if args.dpo_beta is None else args.dpo_beta
        return load_dpo(args.model, args.dpo_reference, beta=beta, **common, **extra)
    if getattr(args, "judge_tokens", None) is not None:
        return load_judge(args.model, tokens=args.judge_tokens, **common, **extra)
    if getattr(args, "prm_separator", None) is not None:
        return load_prm(args.model, separator=args.prm_separator, combine=args.prm_combine or "min",
                        tokens=args.prm_tokens, readout=args.readout, **common, **extra)
    return load(args.model, device_map=args.device_map, readout=args.readout, **common, **extra)


_BELONGS = {"prm_combine": "prm_separator", "prm_tokens": "prm_separator", "dpo_beta": "dpo_reference"}
"""Options that mean something only with the kind they name."""


def _refuse_orphans(args: argparse.Namespace, kind: str | None) -> None:
    """Refuse a kind's option given without its kind, and --readout for a judge or DPO reward (their
    read-out is fixed): silently dropped, the run would measure another reward than the one asked for."""
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    for option, owner in _BELONGS.items():
        if getattr(args, option, None) is not None and kind != owner:
            raise ArgumentError(f"{flag(option)} is for {flag(owner)}, which was not given; pass {flag(owner)} "
                                f"too, or drop {flag(option)}")
    if kind in ("judge_tokens", "dpo_reference") and getattr(args, "readout", None) is not None:
        raise ArgumentError(f"--readout picks a sequence classifier's or PRM's output; {flag(kind)} reads a fixed "
                            "one (the log-odds of two tokens, or the implicit DPO reward): drop --readout")


def read_pairs(args: argparse.Namespace) -> list[Pair]:
    """The --pairs file (required once a model is given), cut to --limit."""
    if not args.pairs:
        raise ArgumentError("--pairs FILE is required when a model is given")
    return pairs_file(args, args.pairs, limit=args.limit)


def pairs_file(args: argparse.Namespace, path: str, *, limit: int | None = None) -> list[Pair]:
    """Any pairs file a command reads (numpy, no torch); `--strict` refuses degenerate pairs."""
    from ..data import load_pairs

    return load_pairs(path, limit=limit, strict=getattr(args, "strict", False))
