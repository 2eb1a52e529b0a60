"""`rewardlens circuit`: edge attribution (EAP / EAP-IG), optionally verified by path patching, and the
circuit of the top edges, with its faithfulness."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (
    ArgumentError,
    Command,
    add_model_options,
    add_pairs_options,
    load_model,
    positive,
    read_pairs,
    table,
)
from .causal import positions


def _count(text: str) -> int:
    """An argparse `type=`: an int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_pairs_options(p)
    p.add_argument("--method", choices=["eap", "eap-ig"], default="eap-ig", help="edge scores (default eap-ig)")
    p.add_argument("--steps", type=positive(int), default=5, help="EAP-IG points on the line to the corrupted run")
    p.add_argument("--level", choices=["sublayer", "head"], default="sublayer",
                   help="edge granularity: sublayers, or heads (each head and its input a node); the circuit is "
                        "evaluated at the same level")
    p.add_argument("--receivers", choices=["whole", "qkv"], default="whole",
                   help="with --level head: a head's query, key and value inputs as one node (whole, default) or "
                        "as three (qkv)")
    p.add_argument("--top", type=positive(int), default=10, help="edges to keep")
    p.add_argument("--mode", choices=["noising", "denoising", "ablation"], default="noising")
    p.add_argument("--positions", type=positions, default="read",
                   help="positions corrupted: 'read' (default: only the last hop into the reward moves), 'all' "
                        "(token-aligned pairs: finds earlier hops), 'prefix', or spans like '-4:'")
    p.add_argument("--verify", type=_count, default=0,
                   help="score the top N edges by exact path patching (the cheap scores only propose them) and "
                        "rank by those scores; 0 (default): first-order scores alone")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _check(args: argparse.Namespace) -> None:
    if args.receivers == "qkv" and args.level != "head":
        raise ArgumentError("--receivers qkv splits a head's query, key and value inputs, but --level is "
                            f"{args.level}, whose nodes are whole sublayers; pass --level head too")


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from ..causal import circuit, edges
    from ..stats import mean_abs, top_parts

    pairs = read_pairs(args)  # a bad pairs file is named before the model loads
    model = load_model(args)
    scored = edges(model, pairs, method=args.method, steps=args.steps, level=args.level,
                   qkv=args.receivers == "qkv", mode=args.mode, positions=args.positions, verify=args.verify,
                   batch_size=args.batch_size, progress=not args.quiet)
    exact, flat, names = scored.exact, scored.flat(), scored.names
    size = mean_abs(flat)  # the statistic `Edges.top` ranks by (`stats.top_parts`), printed beside the signed mean
    out: dict[str, Any] = {
        "method": scored.method, "level": scored.level, "mode": scored.mode,
        "positions": args.positions if isinstance(args.positions, str) else "spans", "verify": args.verify,
        "top_edges": [{"upstream": names[i][0], "downstream": names[i][1], "mean_abs_score": float(size[i]),
                       "score": float(flat[:, i].mean()),
                       "exact": bool(exact[scored.upstream.index(names[i][0]), scored.downstream.index(names[i][1])])}
                      for i in top_parts(flat, args.top)]}
    found = circuit(model, pairs, edges=scored, top=args.top, positions=args.positions, batch_size=args.batch_size,
                    progress=not args.quiet)
    out["circuit"] = found.to_dict()  # evaluated at the edges' level (heads as nodes at --level head)
    return out


def _show(result: dict[str, Any]) -> None:
    verified = f"; the top {result['verify']} by exact path patching" if result["verify"] else ""
    print(f"top edges by mean |score| over pairs ({result['method']}{verified}, {result['mode']}, "
          f"{result['positions']} positions; margin effect, reward units; exact: into 'reward' or path-patched, "
          "est.: a first-order estimate):")
    print(table(["upstream", "downstream", "mean |score|", "mean score", "exact"],
                [[e["upstream"], e["downstream"], f"{e['mean_abs_score']:.4f}", f"{e['score']:+.4f}",
                  "yes" if e["exact"] else "est."] for e in result["top_edges"]]))
    c = result["circuit"]
    n_exact = sum(k["exact"] for k in c["kept"])
    print(f"\n{c['level']}-level circuit of {len(c['kept'])} edges carries {c['share']:.1%} of each pair's own clean "
          f"margin (|margin|-weighted; mean |margin| {c['mean_abs_clean_margin']:.4f}) and "
          f"{c['share_of_mean_margin']:.1%} of the mean clean margin {c['clean_margin']:+.4f} (a ratio of means; no "
          f"edge: {c['empty_margin']:+.4f}); {n_exact} of its edge scores are exact")
    print(table(["edges", "share of own margins", "share of mean margin"],
                [[p["edges"], f"{p['share']:.3f}", f"{p['share_of_mean_margin']:.3f}"] for p in c["curve"]]))
    if c["warning"]:
        print(f"\n{c['warning']}")

COMMANDS = [Command("circuit", "edge attribution (EAP, EAP-IG), verified by path patching, and the circuit of the "
                    "top edges", _add_arguments, _run, _show, check=_check)]
