"""`graph`: attribution graphs of preference pairs over transcoders (or the MLPs' neurons): one interactive page
per pair's margin graph, circuit-tracer graph files, and the scores, closure and top paths printed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import (
    ArgumentError,
    Command,
    add_model_options,
    add_pairs_options,
    check_folder,
    check_out_folder,
    finite,
    load_model,
    positive,
    read_pairs,
    table,
)

DEFAULT_PAIRS = 3
"""Pairs graphed when --limit is not given: a graph is per pair, and a pair costs many backward passes."""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_pairs_options(p)
    p.add_argument("--transcoders", default=None, help="transcoder folder (rewardlens transcoders train, sparsify or "
                   "circuit-tracer layout); required unless --basis neurons")
    p.add_argument("--basis", choices=["transcoders", "neurons"], default="transcoders",
                   help="feature nodes: transcoder features, or the MLPs' own neurons (exact, small models)")
    p.add_argument("--out", required=True, help="folder: pair_<i>.html pages and graph-files/ (circuit-tracer)")
    p.add_argument("--max-nodes", type=positive(int), default=None, help="feature nodes with rows (default 4096)")
    p.add_argument("--align", choices=["prefix", "read"], default="prefix", help="margin graph position rule")
    p.add_argument("--skip-first", type=int, default=None,
                   help="keep every MLP whole (one exact error node, no feature) at each sequence's first N tokens, "
                        "as the transcoders were trained (default: 1 for decoders, the attention sink; 0 for encoders)")
    p.add_argument("--node-threshold", type=float, default=0.8, help="pruning: share of influence kept by nodes")
    p.add_argument("--edge-threshold", type=float, default=0.98, help="pruning: share of influence kept by edges")
    p.add_argument("--paths", type=positive(int), default=5, help="top token → reward paths printed per pair")
    p.add_argument("--contexts", type=int, default=3, help="top contexts per feature card (0: none)")
    p.add_argument("--transcoders-any-model", action="store_true",
                   help="accept transcoders trained on another base model name (a renamed copy or a fine-tune)")


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from ..graphs import MAX_NODES, feature_contexts, graph, node_feature, write_graph_page
    from ..sae import load_transcoders, transcoder_fidelity
    from ..sae.internal import check_transcoders

    pairs = read_pairs(args)[:args.limit or DEFAULT_PAIRS]
    model = load_model(args)
    tcs, fit = None, None
    if args.basis == "transcoders":
        tcs = load_transcoders(args.transcoders)
        check_transcoders(model, tcs, trust_base_model=args.transcoders_any_model)
        fit = transcoder_fidelity(model, tcs, pairs, batch_size=args.batch_size,
                                  trust_base_model=args.transcoders_any_model)
    # one pair per call: each pair's sides get their own basis
    graphs = [graph(model, pair, tcs, basis=args.basis, max_nodes=args.max_nodes or MAX_NODES, align=args.align,
                    skip_first=args.skip_first)[0] for pair in pairs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, pg in enumerate(graphs):
        g = pg.margin
        pruned = g.prune(args.node_threshold, args.edge_threshold)
        features = [n for n, k in zip(pruned.nodes.names, pruned.nodes.kind) if k == 0]
        names = [node_feature(n) for n in features]
        contexts = (feature_contexts(model, pairs, names, transcoders=tcs, n=args.contexts)
                    if args.contexts > 0 and names else {})
        s = g.scores
        notes = [f"margin {g.reward:+.4g} (chosen {pg.chosen.reward:+.4g}, rejected {pg.rejected.reward:+.4g})",
                 f"closure gap {g.closure_gap:.2e}; replacement score {s.replacement:.3f}; completeness "
                 f"{s.completeness:.3f}", f"basis {g.basis}; {g.dropped} active features past the node cap",
                 f"pruned to {len(pruned.nodes.names)} nodes (node {args.node_threshold:g}, edge "
                 f"{args.edge_threshold:g})"] + ([fit.describe()] if fit is not None else [])
        page = write_graph_page(pruned, out / f"pair_{i}.html", contexts=contexts, notes=notes)
        saved = g.save(out / "graph-files", slug=f"pair-{i}-margin")
        rows.append({"pair": i, "margin": g.reward, "closure_gap": g.closure_gap,
                     "replacement_score": finite(s.replacement), "completeness_score": finite(s.completeness),
                     "nodes": len(g.nodes.names), "pruned_nodes": len(pruned.nodes.names), "dropped": g.dropped,
                     "top_paths": [{"path": p, "weight": w} for p, w in pruned.top_paths(args.paths)],
                     "page": str(page), "graph_file": str(saved)})
    return {"basis": args.basis, "pairs": rows, "out": str(out),
            "fidelity": None if fit is None else {"summary": fit.describe(),
                                                  "reward_recovered": finite(fit.reward_recovered),
                                                  "explained_variance": {str(k): finite(v) for k, v in
                                                                         fit.explained_variance.items()}}}


def _show(result: dict[str, Any]) -> None:
    if result["fidelity"]:
        print(result["fidelity"]["summary"])
    rows = [(r["pair"], r["margin"], f"{r['closure_gap']:.1e}", r["replacement_score"], r["completeness_score"],
             r["nodes"], r["pruned_nodes"]) for r in result["pairs"]]
    print(table(["pair", "margin", "closure gap", "replacement", "completeness", "nodes", "pruned"], rows))
    for r in result["pairs"]:
        print(f"\npair {r['pair']}: top paths to the margin (product of edge weights)")
        for p in r["top_paths"]:
            print(f"  {p['weight']:+.4g}  {' → '.join(p['path'])}")
        print(f"  page: {r['page']}")
    print(f"\nwritten to {result['out']} (graph-files/ opens in circuit-tracer's local frontend)")


def _check(args: argparse.Namespace) -> None:
    check_out_folder(args.out, "--out folder")
    if args.basis == "transcoders":
        if not args.transcoders:
            raise ArgumentError("--transcoders DIR is required with --basis transcoders (train them with "
                                "`rewardlens transcoders train`), or pass --basis neurons")
        check_folder(args.transcoders, "transcoder folder")
    elif args.transcoders:
        raise ArgumentError("--basis neurons uses the MLPs' own neurons; drop --transcoders or use --basis transcoders")
    if args.skip_first is not None and (args.skip_first < 0 or (args.skip_first and args.basis != "transcoders")):
        raise ArgumentError(f"--skip-first {args.skip_first} is a count of tokens >= 0 and applies to --basis "
                            "transcoders only (the neurons are exact at every position)")
    for name in ("node_threshold", "edge_threshold"):
        v = getattr(args, name)
        if not 0 < v <= 1:
            raise ArgumentError(f"--{name.replace('_', '-')} {v} is a share of influence in (0, 1]; e.g. 0.8")
    if args.contexts < 0:
        raise ArgumentError(f"--contexts {args.contexts} is a count of contexts per feature; pass 0 or more")


COMMANDS = [Command("graph", "attribution graphs of pairs over transcoders: pages, circuit-tracer files, top paths",
                    _add_arguments, _run, _show, check=_check)]
