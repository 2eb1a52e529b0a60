"""Command line: `rewardlens score|lens|attribute|audit MODEL --pairs FILE [--json]`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

from .attribution import attribute
from .data import Pair, load_pairs
from .errors import RewardLensError
from .lens import lens
from .loading import load
from .model.core import RewardModel


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (floats with 4 decimals)."""
    cells = [[f"{c:+.4f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda xs: "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(xs, widths)))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _pair_id(pair: Pair, i: int) -> str:
    return pair.id if pair.id is not None else str(i)


def _score(model: RewardModel, pairs: list[Pair], args) -> dict:
    rewards = model.score(pairs, batch_size=args.batch_size)
    chosen, rejected = rewards[0::2], rewards[1::2]
    return {
        "pairs": [
            {"id": _pair_id(p, i), "chosen": float(c), "rejected": float(r), "margin": float(c - r)}
            for i, (p, c, r) in enumerate(zip(pairs, chosen, rejected))
        ],
        "accuracy": float(np.mean(chosen > rejected)),
    }


def _lens(model: RewardModel, pairs: list[Pair], args) -> dict:
    ln = lens(model, pairs, batch_size=args.batch_size)
    out = {"n_layers": ln.n_layers, "fraction": args.fraction, "pairs": []}
    for kind in ("linear", "normed"):
        depth = ln.crystallization(kind, args.fraction)
        out[f"median_crystallization_{kind}"] = float(np.nanmedian(depth)) if np.isfinite(depth).any() else None
    lin, nrm = ln.margin("linear"), ln.margin("normed")
    dl, dn = ln.crystallization("linear", args.fraction), ln.crystallization("normed", args.fraction)
    near_zero = ln.near_zero_margin()
    for i, p in enumerate(pairs):
        out["pairs"].append({
            "id": _pair_id(p, i), "linear_margin": lin[i].tolist(), "normed_margin": nrm[i].tolist(),
            "crystallization_linear": None if np.isnan(dl[i]) else float(dl[i]),
            "crystallization_normed": None if np.isnan(dn[i]) else float(dn[i]),
            "near_zero_final_margin": bool(near_zero[i]),
        })
    return out


def _attribute(model: RewardModel, pairs: list[Pair], args) -> dict:
    att = attribute(model, pairs, level=args.level, batch_size=args.batch_size)
    margin = att.margin
    return {
        "level": att.level,
        "max_abs_residual_error": float(np.abs(att.residual_error).max()),
        "top_parts": [{"part": n, "mean_margin": v} for n, v in att.top(args.top, by="margin")],
        "pairs": [
            {"id": _pair_id(p, i), "margin": float(att.reward[2 * i] - att.reward[2 * i + 1]),
             "parts": dict(zip(att.names, map(float, margin[i])))}
            for i, p in enumerate(pairs)
        ] if args.all_parts else [],
    }


def _print(command: str, result: dict) -> None:
    if command == "score":
        rows = [(p["id"], p["chosen"], p["rejected"], p["margin"]) for p in result["pairs"]]
        print(_table(["pair", "chosen", "rejected", "margin"], rows))
        print(f"\npair accuracy: {result['accuracy']:.3f} over {len(rows)} pairs")
    elif command == "lens":
        headers = ["pair"] + [f"d{i}" for i in range(result["n_layers"] + 1)] + ["crystal."]
        rows = [[p["id"], *map(float, p["linear_margin"]), "-" if p["crystallization_linear"] is None
                 else f"{p['crystallization_linear']:.2f}"] for p in result["pairs"]]
        print("linear-lens chosen − rejected margin by depth (d0 = embeddings; exact, final norm scale frozen)")
        print(_table(headers, rows))
        print(f"\nmedian crystallization depth (l/L, fraction {result['fraction']}): "
              f"linear {result['median_crystallization_linear']}, normed {result['median_crystallization_normed']}")
    elif command == "attribute":
        print(f"top parts by mean chosen − rejected contribution ({result['level']} level, exact):")
        print(_table(["part", "mean margin"], [(t["part"], t["mean_margin"]) for t in result["top_parts"]]))
        print(f"\nlargest |reward − (Σ parts + constant)|: {result['max_abs_residual_error']:.2e}")


def _audit(model: RewardModel, pairs: list[Pair], args) -> dict:
    return {"model": repr(model), "score": _score(model, pairs, args), "lens": _lens(model, pairs, args),
            "attribute": _attribute(model, pairs, args)}


def _positive(kind: type):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _readout(text: str) -> int | str | list[float]:
    """'2' → index 2, 'helpfulness' → a label, '1,-1' → one weight per head output."""
    if "," in text:
        return [float(x) for x in text.split(",")]
    return int(text) if text.lstrip("-").isdigit() else text


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewardlens", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("score", "score preference pairs"), ("lens", "reward lens and crystallization depth"),
                        ("attribute", "exact component attribution"), ("audit", "score + lens + attribution")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("model", nargs="?" if name == "audit" else None,
                       help="model folder or hub id" + (" (default: the built-in demo model)" if name == "audit" else ""))
        p.add_argument("--pairs", required=name != "audit", help="preference pairs (JSONL, JSON, CSV, Parquet, HF dataset folder)")
        p.add_argument("--limit", type=_positive(int), default=None, help="use only the first N pairs")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.add_argument("--batch-size", type=_positive(int), default=8)
        p.add_argument("--dtype", default=None, help="e.g. bfloat16; head and reductions stay fp32")
        p.add_argument("--device", default=None)
        p.add_argument("--readout", type=_readout, default=None,
                       help="multi-output heads: an objective index, a label, or comma-separated weights")
        p.add_argument("--pad-token-id", type=int, default=None, help="read by this pad id instead of the model's")
        p.add_argument("--max-length", type=_positive(int), default=None)
        p.add_argument("--truncation", choices=["error", "left"], default="error")
        p.add_argument("--trust-remote-code", action="store_true")
        p.add_argument("--level", default="sublayer", choices=["sublayer", "head", "neuron"])
        p.add_argument("--top", type=int, default=10, help="how many parts to list")
        p.add_argument("--fraction", type=_fraction, default=0.5, help="crystallization threshold (share of final margin)")
        p.add_argument("--all-parts", action="store_true", help="JSON: include every part's margin per pair")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would interleave with the table
    try:
        if args.model is None:
            from .demo import DEMO_PAIRS, demo_model_dir

            args.model = str(demo_model_dir())
            pairs = load_pairs(args.pairs, limit=args.limit) if args.pairs else DEMO_PAIRS[: args.limit]
            if not args.json:
                print("auditing the built-in demo model (a tiny random-init Llama reward model) on built-in pairs\n")
        else:
            pairs = load_pairs(args.pairs, limit=args.limit) if args.pairs else None
            if pairs is None:
                raise RewardLensError("--pairs FILE is required when a model is given")
        extra = {"pad_token_id": args.pad_token_id} if args.pad_token_id is not None else {}
        if args.trust_remote_code:
            extra["trust_remote_code"] = True
        model = load(args.model, dtype=args.dtype, device=args.device, readout=args.readout,
                     max_length=args.max_length, truncation=args.truncation, **extra)
        run = {"score": _score, "lens": _lens, "attribute": _attribute, "audit": _audit}[args.command]
        result = run(model, pairs, args)
    except (RewardLensError, OSError, ValueError) as exc:
        # Bad input (a model path, a pairs file, an option): one line that names it, no traceback.
        print(f"rewardlens: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.command == "audit":
        print(result["model"] + "\n")
        for part in ("score", "lens", "attribute"):
            _print(part, result[part])
            print()
    else:
        _print(args.command, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
