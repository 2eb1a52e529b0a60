"""`transcoders train`: per-layer TopK transcoders (MLP input → MLP output) over the pairs' tokens, saved in the
SAE folder layout (sparsify's), with their fidelity: per-layer explained variance and reward recovered."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (
    ArgumentError,
    Command,
    add_model_options,
    add_pairs_options,
    check_out_folder,
    finite,
    load_model,
    positive,
    read_pairs,
    table,
)


def _layers(text: str) -> list[int]:
    """'all', '3', '0,2,5' or '4-7' (ranges and lists mix: '0-2,9')."""
    if text == "all":
        return []
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a layer list; pass 'all', '3', '0,2,5' or '4-7'") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: layers are numbers >= 0; pass 'all', '3', '0,2,5' or '4-7'")
    return out


def _add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="tc_command", required=True)
    t = sub.add_parser("train", help="train one TopK transcoder per MLP over the pairs' tokens (both sides)")
    add_model_options(t)
    add_pairs_options(t)
    t.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of a table")
    t.add_argument("--layers", type=_layers, default=[], help="'all' (default), '3', '0,2,5' or '4-7'")
    t.add_argument("--out", required=True, help="folder; one layers.<l>.mlp/ subfolder per layer (sparsify layout)")
    t.add_argument("--features", type=positive(int), default=None, help="features per layer (default 8 × d_model)")
    t.add_argument("--k", type=positive(int), default=32, help="active features per token (TopK)")
    t.add_argument("--skip", action="store_true", help="learn a linear skip term x W_skip too (skip transcoders)")
    t.add_argument("--epochs", type=positive(int), default=1)
    t.add_argument("--tc-batch-size", type=positive(int), default=1024, help="tokens per optimiser step")
    t.add_argument("--lr", type=positive(float), default=None, help="default: 2e-4 / sqrt(features / 2^14)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true", help="no progress bar")


def _train(args: argparse.Namespace) -> dict[str, Any]:
    from ..sae import TranscoderTrainConfig, train_transcoders, transcoder_fidelity

    pairs = read_pairs(args)
    model = load_model(args)
    cfg = TranscoderTrainConfig(d_sae=args.features or 0, k=args.k, skip=args.skip, epochs=args.epochs,
                                batch_size=args.tc_batch_size, buffer_rows=max(1 << 15, args.tc_batch_size),
                                lr=args.lr, seed=args.seed, model_batch_size=args.batch_size)
    res = train_transcoders(model, pairs, layers=args.layers or None, config=cfg, progress=not args.quiet)
    folder = res.transcoders.save(args.out)
    fit = transcoder_fidelity(model, res.transcoders, pairs, batch_size=args.batch_size)
    final = res.to_frame().set_index("layer")
    return {"command": "train", "folder": str(folder), "layers": list(res.transcoders.layers),
            "features": res.transcoders.d_sae, "k": args.k, "skip": args.skip, "tokens": res.n_tokens,
            "seconds": res.seconds, "tokens_per_second": res.tokens_per_second,
            "per_layer": [{"layer": la, "explained_variance": finite(fit.explained_variance[la]), "l0": fit.l0[la],
                           "final_fvu": finite(float(final.loc[la, "final_fvu"])),
                           "dead_fraction": res.dead_fraction[la]} for la in res.transcoders.layers],
            "reward_recovered": finite(fit.reward_recovered), "fidelity": fit.describe()}


def _show(result: dict[str, Any]) -> None:
    print(f"trained {len(result['layers'])} transcoder(s), {result['features']} features, k={result['k']}"
          f"{' with skip' if result['skip'] else ''}, on {result['tokens']} tokens in {result['seconds']:.1f} s "
          f"({result['tokens_per_second']:.0f} tokens/s)")
    rows = [(r["layer"], r["explained_variance"], r["final_fvu"], f"{r['l0']:.1f}", f"{r['dead_fraction']:.3f}")
            for r in result["per_layer"]]
    print(table(["layer", "explained variance", "final FVU", "L0", "dead"], rows))
    print(f"\n{result['fidelity']}")
    print(f"\nsaved to {result['folder']}")


def _check(args: argparse.Namespace) -> None:
    check_out_folder(args.out, "--out folder")
    if args.features is not None and args.features < args.k:
        raise ArgumentError(f"--k {args.k} exceeds --features {args.features}; lower --k or add features")


COMMANDS = [Command("transcoders", "per-layer TopK transcoders of the MLPs: `transcoders train`", _add_arguments,
                    lambda args: _train(args), _show, check=_check)]
