"""`sae train` and `sae attribute`: TopK SAEs on a layer's residual stream, and the reward split over them."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from ._common import (
    ArgumentError,
    Command,
    add_model_options,
    add_pairs_options,
    check_folder,
    check_out_file,
    check_out_folder,
    load_model,
    positive,
    read_pairs,
    table,
)

DEFAULT_MEMORY_GB = 2.0
"""`sae train --memory-gb`'s default: `rewardlens.sae._memory.DEFAULT_MEMORY_GB`, written here so the CLI starts
without importing torch (tests/sae/test_memory.py checks the two agree)."""


def _common(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_pairs_options(p)
    # The parent `sae` parser has --json too, but options after the subcommand are parsed here;
    # SUPPRESS keeps `rewardlens sae --json train ...` working as well.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of a table")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="sae_command", required=True)
    t = sub.add_parser("train", help="train a TopK SAE on a layer's residual stream over the pairs' tokens")
    _common(t)
    t.add_argument("--layer", type=int, required=True, help="train on the residual stream after this layer")
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.add_argument("--out", required=True, help="parent folder; the SAE goes to OUT/<hook point> (sparsify layout)")
    t.add_argument("--positions", choices=["all", "read"], default="all",
                   help="every non-pad token (default) or only the read position")
    t.add_argument("--skip-first", type=int, default=None,
                   help="with --positions all, leave out each sequence's first N tokens (default: 1 for decoders, "
                        "whose first token is an attention sink with a huge norm; 0 for encoders)")
    t.add_argument("--k", type=positive(int), default=32, help="active latents per activation")
    t.add_argument("--expansion-factor", type=positive(int), default=16, help="latents per residual dimension")
    t.add_argument("--latents", type=int, default=0, help="number of latents (overrides --expansion-factor)")
    t.add_argument("--epochs", type=positive(int), default=1)
    t.add_argument("--sae-batch-size", type=positive(int), default=4096, help="activations per optimizer step")
    t.add_argument("--lr", type=positive(float), default=None, help="default: 2e-4 / sqrt(latents / 2^14)")
    t.add_argument("--auxk-alpha", type=float, default=1 / 32, help="weight of the dead-latent AuxK loss")
    t.add_argument("--max-norm-ratio", type=float, default=10.0,
                   help="leave out activations over this multiple of the median norm (massive activations); "
                        "0 keeps all")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--cache", default=None, help="activation cache folder (safetensors shards), reused if present")
    t.add_argument("--memory-gb", type=float, default=DEFAULT_MEMORY_GB,
                   help="without --cache, hold the activations in memory when they fit this many GB (tokens × "
                        "width × 4 bytes), so the model runs once rather than once per epoch "
                        f"(default {DEFAULT_MEMORY_GB:g}; 0 always reruns the model)")
    a = sub.add_parser("attribute", help="split each pair's reward margin over an SAE's features")
    _common(a)
    a.add_argument("--sae", required=True, help="SAE folder (cfg.json + sae.safetensors) or a parent of several")
    a.add_argument("--layer", type=int, default=None, help="default: read from the SAE folder's name")
    a.add_argument("--top", type=positive(int), default=10, help="how many features to list")
    a.add_argument("--contexts", type=int, default=3, help="top-activating token windows per feature (0: none)")
    a.add_argument("--sae-any-model", action="store_true",
                   help="accept an SAE whose recorded base model is not this model (a renamed copy, a fine-tune)")
    _add_rank(a)
    _add_report(sub)


def _add_rank(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rank", choices=["direct", "total_approx"], default="direct",
                   help="rank features by their exact direct margin contribution (default) or by the first-order "
                        "total effect of ablating each (one backward per batch; finds features that act through "
                        "later layers)")


def _add_report(sub: Any) -> None:
    r = sub.add_parser("report", help="write one self-contained HTML page browsing the top features' cards")
    _common(r)
    r.add_argument("--sae", required=True, help="SAE folder (cfg.json + sae.safetensors) or a parent of several")
    r.add_argument("--layer", type=int, default=None, help="default: read from the SAE folder's name")
    r.add_argument("--out", required=True, help="the HTML file to write")
    r.add_argument("--top", type=positive(int), default=20, help="how many features get a card")
    r.add_argument("--contexts", type=positive(int), default=5, help="top-activating token windows per feature")
    r.add_argument("--sae-any-model", action="store_true",
                   help="accept an SAE whose recorded base model is not this model's name (a renamed copy, fine-tune)")
    _add_rank(r)


def _report(args: argparse.Namespace) -> dict[str, Any]:
    from ..sae import attribute_features, feature_report, feature_totals, load_sae_for, write_feature_page

    pairs = read_pairs(args)
    model = load_model(args)
    sae, layer = load_sae_for(model, args.sae, args.layer, trust_base_model=args.sae_any_model)
    att = attribute_features(model, sae, pairs, layer=layer, batch_size=args.batch_size)
    ranking = (feature_totals(model, sae, pairs, layer=layer, batch_size=args.batch_size)
               if args.rank == "total_approx" else None)
    report = feature_report(model, sae, att, pairs, top=args.top, n_contexts=args.contexts,
                            batch_size=args.batch_size, ranking=ranking)
    page = write_feature_page(report, args.out, title=f"SAE features at layer {layer}: {sae.folder}")
    return {"command": "report", "page": str(page), "sae": str(sae.folder), "layer": layer, "pairs": len(pairs),
            "score_kind": report.score_kind, "features": [c.row() for c in report.cards],
            "fidelity": _fit(att.fidelity)}


def _show_report(result: dict[str, Any]) -> None:
    kind = result["score_kind"]
    rows = [(f["feature"], f[kind], f["difference"], f["top_context"]) for f in result["features"]]
    print(f"SAE {result['sae']} at the residual after layer {result['layer']}, {result['pairs']} pairs")
    score = "mean margin" if kind == "margin" else "mean margin, total_approx"
    print(table(["feature", score, "chosen − rejected activation", "strongest context"], rows))
    if result["fidelity"]:
        print(result["fidelity"]["summary"])
    print(f"\nwrote {len(rows)} feature cards to {result['page']}")


def _fit(fit: Any) -> dict[str, Any] | None:
    """A `Fidelity` as JSON: its numbers and its one-line summary (None when not measured)."""
    if fit is None:
        return None
    return {"point": fit.point, "positions": fit.positions, "explained_variance": fit.explained_variance,
            "reward_recovered": fit.reward_recovered, "l0": fit.l0, "activations": fit.n_activations,
            "poor": fit.poor, "summary": fit.describe()}


def _train(args: argparse.Namespace) -> dict[str, Any]:
    from ..model import TraceKey
    from ..sae import ActivationSource, SAEConfig, TrainConfig, evaluate, fidelity, train_sae
    from ..sae.internal import hookpoint

    pairs = read_pairs(args)
    model = load_model(args)
    point = TraceKey.resid(args.layer)
    source = ActivationSource(model, pairs, point, positions=args.positions, batch_size=args.batch_size,
                              skip_first=args.skip_first, progress=not args.quiet)
    data, held = _held(source, args)
    print(held, file=sys.stderr)  # before the passes, so the user knows which wait is coming
    cfg = TrainConfig(
        sae=SAEConfig(k=args.k, expansion_factor=args.expansion_factor, num_latents=args.latents),
        batch_size=args.sae_batch_size, epochs=args.epochs, lr=args.lr, auxk_alpha=args.auxk_alpha, seed=args.seed,
        buffer_rows=max(1 << 16, args.sae_batch_size), max_norm_ratio=args.max_norm_ratio or None,
    )
    result = train_sae(data, cfg, progress=not args.quiet)
    folder = result.sae.save(f"{args.out}/{hookpoint(model, point)}")
    stats = evaluate(result.sae, data, max_norm=result.max_norm)
    fit = fidelity(model, result.sae, pairs, point, positions=args.positions, skip_first=args.skip_first,
                   batch_size=args.batch_size)
    return {
        "command": "train", "folder": str(folder), "point": point.name, "positions": args.positions,
        "d_in": result.sae.d_in, "latents": result.sae.n_latents, "k": result.sae.k,
        "activations": source.n_rows, "steps": len(result.fvu), "seconds": result.seconds,
        "activations_per_second": result.activations_per_second,
        "fvu": stats.fvu, "explained_variance": stats.explained_variance, "l0": stats.l0,
        "dead_fraction": stats.dead_fraction, "max_norm": result.max_norm, "dropped": stats.n_dropped,
        "fidelity": _fit(fit), "activations_held": held,
    }


def _held(source: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """(what `sae train` trains on, one line saying which): the shard cache with --cache, else the activations in
    memory when they fit --memory-gb (`hold_activations`), else the model rerun on every epoch."""
    from ..sae import cache_activations, hold_activations

    if args.cache:
        return cache_activations(source, args.cache), (f"activations cached on disk in {args.cache} (--cache): "
                                                       "the model runs at most once")
    data, line = hold_activations(source, args.memory_gb)
    if data is source and args.epochs > 1:
        line += f" ({args.epochs} epochs: raise --memory-gb, or pass --cache DIR to keep them on disk)"
    return data, line


def _attribute(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from ..data import margin
    from ..sae import attribute_features, feature_report, feature_totals, load_sae_for

    pairs = read_pairs(args)
    model = load_model(args)
    sae, layer = load_sae_for(model, args.sae, args.layer, trust_base_model=args.sae_any_model)
    att = attribute_features(model, sae, pairs, layer=layer, batch_size=args.batch_size)
    ranking = (feature_totals(model, sae, pairs, layer=layer, batch_size=args.batch_size)
               if args.rank == "total_approx" else None)
    top = att.top(args.top, by="margin") if ranking is None else ranking.top(args.top, by="margin")
    freq: dict[int, float] = {}
    contexts: dict[int, list[dict[str, Any]]] = {}
    report = None
    if args.contexts > 0:
        report = feature_report(model, sae, att, pairs, top=args.top, n_contexts=args.contexts,
                                batch_size=args.batch_size, ranking=ranking)
        freq = {int(f): float(q) for f, q in zip(report.features, report.frequency)}
        contexts = {int(f): [{"text": c.text, "activation": c.activation, "input": c.input} for c in ctx]
                    for f, ctx in zip(report.features, report.contexts)}
    col = {int(f): i for i, f in enumerate(att.features)}
    totals = att.totals()
    mean_margin = {k: float(np.mean(margin(v))) for k, v in totals.items()}
    return {
        "command": "attribute", "sae": str(sae.folder), "layer": layer, "pairs": len(pairs),
        "max_abs_residual_error": float(np.abs(att.residual_error).max()),
        "max_abs_reward": float(np.abs(att.reward).max()),
        "fvu_at_read_position": att.fvu, "relative_error_at_read_position": att.relative_error,
        "corpus": None if report is None else {
            "explained_variance": report.explained_variance, "l0": report.l0, "dead_fraction": report.dead_fraction,
            "activations": report.n_activations},
        "mean_margin": mean_margin, "fidelity": _fit(att.fidelity), "rank": args.rank,
        "top_features": [
            {"feature": f, "ranked_by": abs(s), "mean_margin": float(att.margin[:, col[f]].mean()),
             "total_approx": None if ranking is None else s, "alignment": float(att.alignment[col[f]]),
             "pairs_positive": float(np.mean(att.margin[:, col[f]] > 0)), "frequency": freq.get(f),
             "contexts": contexts.get(f, [])}
            for f, s in top
        ],
    }


def _run(args: argparse.Namespace) -> dict[str, Any]:
    if args.sae_command == "report":
        return _report(args)
    return _train(args) if args.sae_command == "train" else _attribute(args)


def _show(result: dict[str, Any]) -> None:
    if result["command"] == "report":
        _show_report(result)
        return
    if result["command"] == "train":
        print(f"trained a TopK SAE on {result['point']} ({result['positions']} positions): "
              f"{result['latents']} latents, k={result['k']}, {result['activations']} activations, "
              f"{result['steps']} steps")
        rows = [("explained variance", result["explained_variance"]), ("FVU", result["fvu"]), ("L0", result["l0"]),
                ("dead fraction", result["dead_fraction"]),
                ("activations / s", f"{result['activations_per_second']:.0f}")]
        print(table(["", "value"], rows))
        if result["dropped"]:
            print(f"\n{result['dropped']} activations with a norm over {result['max_norm']:.1f} were left out "
                  "(massive activations; --max-norm-ratio 0 keeps them)")
        print(f"\n{result['fidelity']['summary']}")
        print(f"\nsaved to {result['folder']}")
        return
    print(f"SAE {result['sae']} at the residual after layer {result['layer']}, {result['pairs']} pairs")
    approx = result["rank"] == "total_approx"
    features = [(t["feature"], t["ranked_by"], t["mean_margin"], *([t["total_approx"]] if approx else []),
                 t["alignment"], f"{t['pairs_positive']:.2f}", t["contexts"][0]["text"] if t["contexts"] else "")
                for t in result["top_features"]]
    print("top features by |mean first-order total effect| of ablating each (total_approx, an estimate; reward units):"
          if approx else "top features by |mean chosen − rejected contribution| (exact, reward units):")
    ranked_by = "|mean total_approx|" if approx else "|mean margin|"
    print(table(["feature", ranked_by, "mean margin", *(["total_approx"] if approx else []), "cos(d, u)", "share > 0",
                 "strongest context"], features))
    m = result["mean_margin"]
    print(f"\nmean margin {m['total']:+.4f} = features {m['features']:+.4f} + decoder bias {m['decoder_bias']:+.4f} "
          f"+ SAE error {m['error']:+.4f} + later layers {m['rest']:+.4f} + constant {m['constant']:+.4f}")
    if result["corpus"]:
        c = result["corpus"]
        print(f"SAE on the pairs' tokens: explained variance {c['explained_variance']:.3f}, L0 {c['l0']:.1f}, "
              f"dead fraction {c['dead_fraction']:.3f}")
    print(f"at the read position: FVU {result['fvu_at_read_position']:.3f}, Σ‖ε‖² / Σ‖x‖² "
          f"{result['relative_error_at_read_position']:.3f}")
    if result["fidelity"]:
        print(result["fidelity"]["summary"])
    print(f"largest |reward − Σ parts|: {result['max_abs_residual_error']:.2e} "
          f"(largest |reward| {result['max_abs_reward']:.3f})")


def _check(args: argparse.Namespace) -> None:
    if args.sae_command == "report":
        check_out_file(args.out, "--out page")
    if args.sae_command == "train":
        check_out_folder(args.out, "--out folder")
        if args.cache:
            check_out_folder(args.cache, "--cache folder")
        if not (math.isfinite(args.memory_gb) and args.memory_gb >= 0):
            raise ArgumentError(f"--memory-gb {args.memory_gb} is not a memory budget (a finite number of GB >= 0); "
                                f"pass e.g. {DEFAULT_MEMORY_GB:g} (the default), or 0 to rerun the model every epoch")
        if not (math.isfinite(args.auxk_alpha) and args.auxk_alpha >= 0):
            raise ArgumentError(f"--auxk-alpha {args.auxk_alpha} is not a loss weight (a finite number >= 0); pass "
                                "e.g. 0.03125 (the default, 1/32), or 0 to train without the dead-latent AuxK loss")
        ratio = args.max_norm_ratio
        if not (ratio == 0 or (math.isfinite(ratio) and ratio > 1)):
            raise ArgumentError(f"--max-norm-ratio {ratio} is not a multiple of the median norm above 1 (a finite "
                                "number > 1, or 0); pass e.g. 10 (the default), or 0 to keep every activation")
    else:
        check_folder(args.sae, "SAE folder")
    if args.sae_command == "attribute" and args.contexts < 0:
        raise ArgumentError(f"--contexts {args.contexts} is a count of token windows per feature; pass 0 (none) or "
                            "more (default 3)")


COMMANDS = [Command("sae", "TopK sparse autoencoders: `sae train`, `sae attribute`, `sae report`", _add_arguments,
                    _run, _show, check=_check)]
