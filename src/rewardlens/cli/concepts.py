"""`rewardlens concepts`: concept directions per layer and their causal dose-response."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ._common import ArgumentError, Command, add_model_options, check_input, finite, load_model, positive, table

if TYPE_CHECKING:
    from ..hacking import ConceptSets

ALPHAS = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0)
"""`rewardlens.hacking.ALPHAS`, the default doses (tests/cli checks the two agree)."""


def concept_option(text: str) -> tuple[str, str, str]:
    """'NAME=POS_FILE,NEG_FILE' → (name, positive file, negative file)."""
    name, eq, files = text.partition("=")
    parts = files.split(",")
    if not eq or not name.strip() or len(parts) != 2 or not all(p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"expected NAME=POS_FILE,NEG_FILE, got {text!r}")
    return name.strip(), parts[0].strip(), parts[1].strip()


def layer_option(text: str) -> int | str:
    """Parse `--layer`: a layer index or 'embed' (a negative index is refused by `_check`, in one line)."""
    if text == "embed":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a layer index (from 0) or 'embed', got {text!r}") from None


def alphas_option(text: str) -> list[float]:
    """Parse `--alphas`: comma-separated doses such as -2,-1,0,1,2."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like -2,-1,0,1,2, got {text!r}") from None


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from ..hacking import concepts, read_concept_file

    # Each line of a text file is scored as a response after an empty user turn, through the chat
    # template, as a pair's response is (docs/concepts.md): bare text read differently gave another slope.
    sets: ConceptSets | None = ({name: (read_concept_file(pos), read_concept_file(neg))
                                 for name, pos, neg in args.concept} if args.concept else None)
    model = load_model(args)
    res = concepts(model, sets, dose_layer=args.layer, alphas=args.alphas, positions=args.positions, unit=args.unit,
                   n_boot=args.boot, batch_size=args.batch_size, progress=not args.quiet)
    clean = lambda row: {k: finite(v) if isinstance(v, float) else v for k, v in row.items()}
    return {
        "dose_layer": res.dose_layer, "positions": res.positions, "unit": res.unit, "folds": res.folds,
        "alphas": res.alphas.tolist(), "layers": list(res.layers),
        "concepts": [clean(row) for row in res.rows()],
        "per_layer": [clean(row) for row in res.to_frame().to_dict("records")],
        "mean_dose": {name: [finite(v) for v in np.nanmean(res.dose[c], 1)] for c, name in enumerate(res.names)},
    }


def _show(result: dict[str, Any]) -> None:
    fmt = lambda v: "nan" if v is None else f"{v:+.3f}"
    print(f"dose-response: α·scale·v̂ added at layer {result['dose_layer']} ({result['positions']} positions), "
          f"α in {result['unit']} units {result['alphas']}; slope = Δreward per unit (95% bootstrap CI over inputs)")
    rows = [(r["concept"], fmt(r["slope"]), f"[{fmt(r['slope_lo'])}, {fmt(r['slope_hi'])}]", fmt(r["r2"]),
             fmt(r["half_ratio"]), fmt(r["cosine"]),
             "nan" if r["auroc_heldout"] is None else f"{r['auroc_heldout']:.3f}",
             f"{r['n_positive']}/{r['n_negative']}") for r in result["concepts"]]
    print(table(["concept", "slope", "CI", "R²", "slope+/slope-", f"cos (L{result['layers'][-1]})",
                 "AUROC held-out", "n +/-"], rows))
    names = [r["concept"] for r in result["concepts"]]
    by = {(r["concept"], r["layer"]): r["cosine"] for r in result["per_layer"]}
    print(f"\ncosine of each concept's direction with the effective read-out, by layer (head space, "
          f"{result['folds']}-fold held-out AUROC above):")
    print(table(["concept", *result["layers"]], [(n, *(fmt(by[(n, la)]) for la in result["layers"])) for n in names]))


def _options(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--concept", type=concept_option, action="append", default=None, metavar="NAME=POS_FILE,NEG_FILE",
                   help="a concept from two files (.txt: one response per line, scored after an empty user turn "
                        "through the chat template; .json: a list of texts or "
                        "conversations; .jsonl: one per line); repeat for more. Default: the built-in probe axes")
    p.add_argument("--layer", type=layer_option, default=None, help="dose layer: index or 'embed' (default: last)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--positions", choices=["read", "all"], default="read")
    p.add_argument("--unit", choices=["difference", "sigma"], default="difference",
                   help="unit of α: |mean difference| (default) or within-class sd")
    p.add_argument("--alphas", type=alphas_option, default=list(ALPHAS),
                   help="comma-separated doses, e.g. --alphas=-2,-1,1,2 (with '=': they start with '-')")
    p.add_argument("--boot", type=positive(int), default=2000, help="bootstrap resamples")


def _check(args: argparse.Namespace) -> None:
    # Layers count from 0 on the command line, as `sae --layer` and `audit --sae-layer` count them; Python's
    # `concepts(dose_layer=-1)` counts from the end, but a flag that read -1 as "last" would be the only one.
    if isinstance(args.layer, int) and args.layer < 0:
        raise ArgumentError(f"--layer {args.layer} is not a layer index: layers count from 0 (0: the first layer's "
                            "output; 'embed': its input); pass the index, or leave --layer out for the last layer")
    for _, pos, neg in args.concept or ():
        check_input(pos, "concept file")
        check_input(neg, "concept file")


COMMANDS = [Command("concepts", "concept directions per layer and their causal dose-response", _options, _run, _show,
                    check=_check)]
