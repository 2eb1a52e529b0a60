"""`rewardlens concepts`: concept directions per layer and their causal dose-response."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError
from ._common import Command, add_model_options, check_input, finite, load_model, positive, table

if TYPE_CHECKING:
    from ..hacking import ConceptSets
    from ..types import Text

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
    if text == "embed":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a layer index (negative from the end) or 'embed', "
                                         f"got {text!r}") from None


def alphas_option(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like -2,-1,0,1,2, got {text!r}") from None


def _is_item(x: object) -> bool:
    return isinstance(x, str) or (isinstance(x, list) and bool(x)
                                  and all(isinstance(m, dict) and "role" in m for m in x))


def read_set(path: str) -> list[Text]:
    """A concept set: .json (a list of texts or chat conversations), .jsonl (one per line) or text
    (one input per non-empty line)."""
    p = Path(path).expanduser()
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p}: not valid JSON ({exc}); expected a list of texts or conversations") from None
        where: Callable[[int], str] = lambda i: f"{p}: item {i}"
    elif p.suffix == ".jsonl":
        items, lines = [], [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        for n, line in lines:
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}: line {n} is not valid JSON ({exc})") from None
        where = lambda i: f"{p}: line {lines[i][0]}"
    else:
        items = [line for line in text.splitlines() if line.strip()]
        where = lambda i: f"{p}: line {i + 1}"
    if not isinstance(items, list) or not items:
        raise DataError(f"{p}: expected a non-empty list of texts or chat conversations")
    for i, item in enumerate(items):
        if not _is_item(item):
            raise DataError(f"{where(i)} is a {type(item).__name__}; expected a string or a list of "
                            "{'role', 'content'} messages")
    return items


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from ..hacking import concepts

    sets: ConceptSets | None = ({name: (read_set(pos), read_set(neg)) for name, pos, neg in args.concept}
                                if args.concept else None)
    model = load_model(args)
    res = concepts(model, sets, dose_layer=args.layer, alphas=args.alphas, positions=args.positions, unit=args.unit,
                   n_boot=args.boot, batch_size=args.batch_size)
    clean = lambda row: {k: finite(v) if isinstance(v, float) else v for k, v in row.items()}
    return {
        "dose_layer": res.dose_layer, "positions": res.positions, "unit": res.unit, "folds": res.folds,
        "alphas": res.alphas.tolist(), "layers": list(res.layers),
        "concepts": [clean(row) for row in res.summary()],
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
                   help="a concept from two files (.txt: one input per line; .json: a list of texts or "
                        "conversations; .jsonl: one per line); repeat for more. Default: the built-in probe axes")
    p.add_argument("--layer", type=layer_option, default=None, help="dose layer: index or 'embed' (default: last)")
    p.add_argument("--positions", choices=["read", "all"], default="read")
    p.add_argument("--unit", choices=["difference", "sigma"], default="difference",
                   help="unit of α: |mean difference| (default) or within-class sd")
    p.add_argument("--alphas", type=alphas_option, default=list(ALPHAS),
                   help="comma-separated doses, e.g. --alphas=-2,-1,1,2 (with '=': they start with '-')")
    p.add_argument("--boot", type=positive(int), default=2000, help="bootstrap resamples")


def _check(args: argparse.Namespace) -> None:
    for _, pos, neg in args.concept or ():
        check_input(pos, "concept file")
        check_input(neg, "concept file")


COMMANDS = [Command("concepts", "concept directions per layer and their causal dose-response", _options, _run, _show,
                    check=_check)]
