"""`edit`: erase a concept from what the head reads and save the edited model as a Hugging Face folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError
from ._common import (
    Command,
    add_model_options,
    add_strict_option,
    check_input,
    check_out_folder,
    finite,
    load_model,
    pairs_file,
    positive,
    table,
)

if TYPE_CHECKING:
    from ..model import RewardModel
    from ..types import Text

_FIELDS = ("text", "messages", "conversation")
METHODS = ("project", "leace")
"""`rewardlens.hacking.METHODS`, the edit methods (tests/cli checks the two agree)."""


def read_texts(path: str) -> list[Text]:
    """A concept set: strings or chat conversations, one per item.

    `.txt`: one text per non-blank line (use JSON for texts with line breaks). `.jsonl`: one JSON
    value per line; `.json`: a list of them. A value is a string, a list of `{"role", "content"}`
    messages, or an object with `text`, `messages`/`conversation`, or `prompt` + `response`.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"concept file {str(file)!r} does not exist")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"concept file {str(file)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if file.suffix == ".txt":
        return [line for line in text.splitlines() if line.strip()]
    if file.suffix == ".jsonl":
        raw = [(f"line {i + 1}", _json(line, f"{file}, line {i + 1}")) for i, line in enumerate(text.splitlines())
               if line.strip()]
    elif file.suffix == ".json":
        data = _json(text, str(file))
        if not isinstance(data, list):
            raise DataError(f"{file}: a .json concept file holds a list of texts or conversations, "
                            f"got a {type(data).__name__}")
        raw = [(f"item {i}", x) for i, x in enumerate(data)]
    else:
        raise DataError(f"concept file {str(file)!r}: expected .txt, .jsonl or .json, got {file.suffix!r}")
    return [_item(value, f"{file}, {loc}") for loc, value in raw]


def _json(text: str, loc: str) -> Any:
    """`text` parsed as JSON; a malformed concept file is bad input (`DataError`), not a bug."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{loc}: not valid JSON ({e.msg} at column {e.colno})") from None


def _item(value: object, loc: str) -> Text:
    if isinstance(value, dict):
        if "prompt" in value and "response" in value:
            prompt = value["prompt"]
            user = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            return [*user, {"role": "assistant", "content": value["response"]}]
        key = next((k for k in _FIELDS if k in value), None)
        if key is None:
            raise DataError(f"{loc}: an object needs one of {_FIELDS} or prompt + response, got keys {sorted(value)}")
        value = value[key]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DataError(f"{loc}: expected a string or a list of {{'role', 'content'}} messages, got {value!r:.80}")


def _concept(text: str) -> tuple[str, str]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"expected POSITIVE_FILE,NEGATIVE_FILE, got {text!r}")
    return parts[0].strip(), parts[1].strip()


def _gap(model: RewardModel, pos: list[Text], neg: list[Text], batch_size: int) -> float:
    import numpy as np

    return float(np.mean(model.score(pos, batch_size=batch_size)) - np.mean(model.score(neg, batch_size=batch_size)))


def _edit(args: argparse.Namespace) -> dict[str, Any]:
    from ..hacking import edit, edit_report

    pos_file, neg_file = args.concept
    pos, neg = read_texts(pos_file), read_texts(neg_file)
    name = args.name or Path(pos_file).stem
    background = None if args.background is None else pairs_file(args, args.background, limit=args.limit)
    probe = pairs_file(args, args.probe_pairs, limit=args.limit) if args.probe_pairs else None
    other = pairs_file(args, args.pairs, limit=args.limit) if args.pairs else []
    model = load_model(args)
    result = edit(model, pos, neg, method=args.method, name=name, out=args.out, batch_size=args.batch_size,
                  shrinkage=args.shrinkage, background=background)
    out: dict[str, Any] = {
        "method": result.method, "concept": result.name, "out": str(result.path), "layer": result.layer,
        "direction_norm": result.direction_norm, "shrinkage": result.shrinkage,
        "n_positive": result.n_positive, "n_negative": result.n_negative, "n_background": result.n_background,
        "dropped_constant": [float(c) for c in result.dropped_constant],
        # In-sample: the concept sets the edit was fitted on; held-out numbers need --probe-pairs.
        "fit_gap_before": _gap(model, pos, neg, args.batch_size),
        "fit_gap_after": _gap(result.model, pos, neg, args.batch_size),
        "report": None,
    }
    if probe is not None or other:
        report = edit_report(model, result, probe_pairs=probe, other_pairs=other, batch_size=args.batch_size)
        out["report"] = {k: finite(v) if isinstance(v, float) else v for k, v in report.row().items()}
    return out


def _show(result: dict[str, Any]) -> None:
    print(f"erased concept {result['concept']!r} ({result['method']}) from {result['layer']}; "
          f"saved to {result['out']}")
    print(f"fitted on {result['n_positive']} positive and {result['n_negative']} negative inputs; "
          f"|mean difference| {result['direction_norm']:.4f}" +
          (f"; covariance from {result['n_background']} background inputs too, shrinkage {result['shrinkage']:.4f}"
           if result["method"] == "leace" else ""))
    rows = [("concept gap on the fit sets (in-sample)", result["fit_gap_before"], result["fit_gap_after"])]
    r = result["report"]
    fmt = lambda v: "-" if v is None else v
    if r is not None:
        if r["n_probe"]:
            rows.append((f"targeted mean margin ({r['n_probe']} probe pairs)", fmt(r["targeted_before"]),
                         fmt(r["targeted_after"])))
        if r["n_other"]:
            rows.append((f"untargeted accuracy ({r['n_other']} pairs)", fmt(r["accuracy_before"]),
                         fmt(r["accuracy_after"])))
            rows.append(("untargeted mean margin", fmt(r["other_margin_before"]), fmt(r["other_margin_after"])))
    print(table(["quantity", "before", "after"], rows))
    if r is not None and r["share_removed"] is not None:
        print(f"\nshare of the targeted effect removed: {r['share_removed']:.1%}")
    if r is not None and r["accuracy_change_points"] is not None:
        print(f"untargeted accuracy changed by {r['accuracy_change_points']:+.1f} points")
    if any(result["dropped_constant"]):
        print("\nthe edited layer has no bias: the LEACE constant W·P·μ "
              f"({', '.join(f'{c:+.4f}' for c in result['dropped_constant'])}) was dropped; it shifts every "
              "reward equally and leaves margins unchanged (recorded in rewardlens_edit.json)")


def _options(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--concept", type=_concept, required=True,
                   help="POSITIVE_FILE,NEGATIVE_FILE: texts or conversations with and without the concept "
                        "(.txt one per line, .jsonl, .json)")
    p.add_argument("--method", choices=list(METHODS), default="project")
    p.add_argument("--out", required=True, help="folder to save the edited model in (a normal Hugging Face folder)")
    p.add_argument("--name", default=None, help="the concept's name (default: the positive file's name)")
    p.add_argument("--shrinkage", type=float, default=None,
                   help="LEACE: covariance weight on the scaled identity in [0, 1] (default: Ledoit–Wolf estimate)")
    p.add_argument("--background", default=None,
                   help="LEACE: preference pairs like those the model will score (unlabelled; both sides join the "
                        "covariance LEACE whitens by; recommended)")
    p.add_argument("--pairs", default=None, help="untargeted preference pairs: accuracy before and after")
    p.add_argument("--probe-pairs", default=None,
                   help="held-out pairs differing only in the concept (chosen has it): the targeted effect")
    p.add_argument("--limit", type=positive(int), default=None, help="use only the first N pairs of each file")
    add_strict_option(p)


def _check(args: argparse.Namespace) -> None:
    for path in args.concept:
        check_input(path, "concept file")
    check_out_folder(args.out, "--out folder")


COMMANDS = [
    Command("edit", "erase a concept from what the head reads; save the edited model", _options, _edit, _show,
            check=_check),
]
