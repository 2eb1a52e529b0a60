"""`rewardlens conflict`: do the reward's terms (head objectives or user pair sets) conflict on real pairs?"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ._common import (
    ArgumentError,
    Command,
    add_model_options,
    add_pairs_options,
    check_input,
    finite,
    fraction,
    load_model,
    pairs_file,
    positive,
    read_pairs,
    table,
)

if TYPE_CHECKING:
    from ..data import Pair
    from ..model import RewardModel


def term_option(text: str) -> tuple[str, str]:
    """'NAME=FILE' → (name, file)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=FILE (a term name and a pairs file), got {text!r}")
    return name.strip(), path.strip()


def _load(args: argparse.Namespace) -> RewardModel:
    """The model; a multi-output head without --readout loads with readout 0.

    The analysis reads every objective and never the readout scalar, but `rewardlens.load`
    refuses a multi-output head without one, so any valid readout will do."""
    if args.readout is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
        if getattr(config, "num_labels", 1) > 1:
            args = argparse.Namespace(**{**vars(args), "readout": 0})
    return load_model(args)


def _terms(args: argparse.Namespace) -> dict[str, list[Pair]] | None:
    if not args.term:
        return None
    return {name: pairs_file(args, path) for name, path in args.term}


def _check(args: argparse.Namespace) -> None:
    names = [name for name, _ in args.term]
    duplicate = sorted({n for n in names if names.count(n) > 1})
    if duplicate:
        raise ArgumentError(f"--term names must be unique, got {duplicate[0]!r} twice; rename one")
    for _, path in args.term:
        check_input(path, "--term file")


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from ..hacking import conflict

    terms, pairs = _terms(args), read_pairs(args)
    model = _load(args)
    res = conflict(model, pairs, terms=terms, tol=args.tol, min_share=args.min_share, n_boot=args.boot,
                   seed=args.seed, batch_size=args.batch_size)
    matrix = lambda a: None if a is None else [[finite(v) for v in row] for row in a]
    return {
        "source": res.source, "names": res.names, "n_pairs": res.n_pairs, "term_sizes": res.term_sizes,
        "direction_note": res.direction_note, "margin_units": res.margin_units,
        "tol": res.tol, "min_share": res.min_share, "n_boot": res.n_boot,
        "cosine": matrix(res.cosine), "cosine_residual": matrix(res.cosine_residual),
        "pairs": res.pairs_table(),
    }


def _show(result: dict[str, Any]) -> None:
    what = "head objectives" if result["source"] == "objectives" else "user-defined terms (pair sets)"
    print(f"reward-term conflicts among {len(result['names'])} {what} on {result['n_pairs']} pairs "
          f"(95% bootstrap CIs over pairs; decisive: |margin| >= {result['tol']:g} x the term's mean |margin|)")
    print(f"directions: {result['direction_note']}")
    ci = lambda r, s: "nan" if r[s] is None else f"{r[s]:.2f} [{r[f'{s}_lo']:.2f}, {r[f'{s}_hi']:.2f}]"
    cos = lambda v: "-" if v is None else f"{v:+.3f}"
    rows = [(r["term_a"], r["term_b"], cos(r["cosine"]), cos(r["cosine_residual"]), ci(r, "spearman"),
             ci(r, "disagree"), ci(r, "agree"), r["relation"]) for r in result["pairs"]]
    print(table(["term a", "term b", "cos (head input)", "cos (residual)", "Spearman of margins",
                 "disagree share", "agree share", "relation"], rows))
    print(f"\nconflicting: disagreement CI above {result['min_share']:g}; aligned: agreement CI above it and "
          f"disagreement CI below; orthogonal: both CIs below; else mixed (docs/conflict.md)")


def _add(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_pairs_options(p)
    p.add_argument("--term", type=term_option, action="append", default=[], metavar="NAME=FILE",
                   help="a user-defined term from a pairs file (repeat, at least twice); "
                        "default: the head's objectives")
    p.add_argument("--tol", type=float, default=0.5,
                   help="a term is decisive on a pair when |margin| >= tol x its mean |margin| (default 0.25)")
    p.add_argument("--min-share", type=fraction, default=0.05, help="share of pairs a relation must clear")
    p.add_argument("--boot", type=positive(int), default=2000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0)


COMMANDS = [
    Command("conflict", "do the head's objectives or user terms disagree on real pairs?", _add, _run, _show,
            check=_check),
]
