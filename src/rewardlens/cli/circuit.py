"""`rewardlens circuit`: edge attribution (EAP / EAP-IG) and the circuit of the top edges, with its faithfulness."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import Command, add_model_options, add_pairs_options, load_model, positive, read_pairs, table


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_pairs_options(p)
    p.add_argument("--method", choices=["eap", "eap-ig"], default="eap-ig", help="edge scores (default eap-ig)")
    p.add_argument("--steps", type=positive(int), default=5, help="EAP-IG points on the line to the corrupted run")
    p.add_argument("--level", choices=["sublayer", "head"], default="sublayer",
                   help="edge granularity: sublayers, or heads (each head and its input a node); the circuit is "
                        "evaluated at the same level")
    p.add_argument("--top", type=positive(int), default=10, help="edges to keep")
    p.add_argument("--mode", choices=["noising", "denoising", "ablation"], default="noising")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from ..causal import circuit, edges

    pairs = read_pairs(args)  # a bad pairs file is named before the model loads
    model = load_model(args)
    scored = edges(model, pairs, method=args.method, steps=args.steps, level=args.level, mode=args.mode,
                   batch_size=args.batch_size, progress=not args.quiet)
    out: dict[str, Any] = {"method": scored.method, "level": scored.level, "mode": scored.mode,
                           "top_edges": [{"upstream": u, "downstream": d, "score": s, "exact": d == "reward"}
                                         for u, d, s in scored.top(args.top)]}
    found = circuit(model, pairs, edges=scored, top=args.top, batch_size=args.batch_size, progress=not args.quiet)
    out["circuit"] = found.summary()  # evaluated at the edges' level (heads as nodes at --level head)
    return out


def _show(result: dict[str, Any]) -> None:
    print(f"top edges ({result['method']}, {result['mode']}; mean margin effect, reward units; "
          "edges into 'reward' exact, the rest first-order estimates):")
    print(table(["upstream", "downstream", "score", "exact"],
                [[e["upstream"], e["downstream"], f"{e['score']:+.4f}", "yes" if e["exact"] else "est."]
                 for e in result["top_edges"]]))
    c = result["circuit"]
    print(f"\n{c['level']}-level circuit of {len(c['kept'])} edges carries {c['share']:.1%} of the mean clean "
          f"margin {c['clean_margin']:+.4f} (no edge: {c['empty_margin']:+.4f})")
    print(table(["edges", "share of clean margin"], [[p["edges"], f"{p['share']:.3f}"] for p in c["curve"]]))

COMMANDS = [Command("circuit", "edge attribution (EAP, EAP-IG) and the circuit of the top edges", _add_arguments,
                    _run, _show)]
