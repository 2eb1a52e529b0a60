"""`compare`: two reward models on the same pairs — agreement, lens, attribution, probes, directions."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (
    Command,
    add_model_options,
    add_pairs_options,
    fraction,
    load_model,
    positive,
    read_pairs,
    table,
)


def _arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)  # the first model; every loading option applies to both
    p.add_argument("other", metavar="OTHER", help="the model to compare it with (folder or hub id), loaded with "
                   "the same options")
    add_pairs_options(p)
    p.add_argument("--fraction", type=fraction, default=0.5, help="crystallization threshold (share of final margin)")
    p.add_argument("--probes", action="store_true", help="also run the probe suite on both and compare profiles")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--n-boot", type=positive(int), default=2000, help="bootstrap resamples for every CI")
    p.add_argument("--seed", type=int, default=0)


def _compare(args: argparse.Namespace) -> dict[str, Any]:
    from ..compare import compare

    pairs = read_pairs(args)
    first = load_model(args)
    second = load_model(argparse.Namespace(**{**vars(args), "model": args.other}))
    result = compare(first, second, pairs, labels=("A", "B"), fraction=args.fraction,
                     probes=args.probes, n_boot=args.n_boot, seed=args.seed, batch_size=args.batch_size,
                     progress=not args.quiet)
    out = result.to_dict()  # the nested JSON document; summary() is its headline rows
    out["paths"] = {"A": args.model, "B": args.other}
    return out


def _ci(entry: dict[str, Any]) -> str:
    low, high = entry["ci"]
    return "-" if low is None or high is None else f"[{low:+.3f}, {high:+.3f}]"


def _value(x: float | None) -> float | str:
    return "nan" if x is None else x


def _show(result: dict[str, Any]) -> None:
    import numpy as np

    for label in ("A", "B"):
        print(f"{label}: {result['paths'][label]}  {result['models'][result['labels'].index(label)]}")
    agree = result["agreement"]
    # Accuracy is a proportion: its interval is Wilson's (a bootstrap collapses at 0 and 1), the rest bootstrap.
    rows = [("Spearman, rewards (per input)", _value(agree["spearman_reward"]["value"]), _ci(agree["spearman_reward"]),
             "bootstrap"),
            ("Spearman, margins (per pair)", _value(agree["spearman_margin"]["value"]), _ci(agree["spearman_margin"]),
             "bootstrap"),
            ("same winner (share of pairs)", _value(agree["same_winner"]["value"]), _ci(agree["same_winner"]),
             "bootstrap")]
    rows += [(f"accuracy {k}", v["value"], _ci(v), "Wilson") for k, v in agree["accuracy"].items()]
    print(f"\nagreement over {result['n_pairs']} pairs (95% intervals over pairs)")
    print(table(["", "value", "95% CI", "interval"], rows))

    lens, att = result["lens"], result["attribution"]
    print(f"\nmedian crystallization depth l/L (fraction {lens['fraction']} of the final margin):")
    for label, m in lens["models"].items():
        print(f"  {label} ({m['n_layers']} layers): linear {_fmt(m['median_crystallization_linear'])}, "
              f"normed {_fmt(m['median_crystallization_normed'])}")
    for kind, d in lens["crystallization_difference"].items():
        print(f"  B − A per pair ({kind}): mean {_fmt(d['mean'])} {_ci(d)}")
    same_depth = len({m["n_layers"] for m in lens["models"].values()}) == 1
    note = "" if same_depth else "; interpolated onto the deeper model's depths"
    print(f"formation correlation (Pearson r of the lens curves on relative depth l/L, each over its final "
          f"margin{note}; mean over pairs):")
    for kind, d in lens["formation_correlation"].items():
        print(f"  {kind}: {_fmt(d['mean'])} {_ci(d)} on {d['n_defined']} of {result['n_pairs']} pairs")
    print("\nmean margin by relative depth: the linear lens (cumulative) and the attribution written at that depth "
          f"(embeddings at 0){note}; attribution profile correlation {_fmt(att['correlation'])}")
    curve = {k: np.interp(att["grid"], m["depth"], m["mean_linear_margin"]) for k, m in lens["models"].items()}
    print(table(["depth", "lens A", "lens B", "attribution A", "attribution B"],
                [(f"{g:.2f}", float(la), float(lb), a, b)
                 for g, la, lb, a, b in zip(att["grid"], curve["A"], curve["B"], att["A"], att["B"])]))

    if result["probes"] is not None:
        pr = result["probes"]
        print(f"\nprobe profiles (reward change with − without), Spearman {_fmt(pr['spearman'])}")
        axes = [(r["axis"], _value(r["A"]["mean"]), _ci(r["A"]), "FLAGGED" if r["A"]["flagged"] else "",
                 _value(r["B"]["mean"]), _ci(r["B"]), "FLAGGED" if r["B"]["flagged"] else "") for r in pr["axes"]]
        print(table(["axis", "A", "95% CI", "", "B", "95% CI", ""], axes))
        print("flagged when q < 0.05 and |mean| >= " + "; ".join(
            f"{sc['min_effect']:g} x {label}'s scale {'nan' if sc['scale'] is None else format(sc['scale'], '.4g')} "
            f"({sc['source']})"
            for label, sc in pr["scale"].items()))

    dirs = result["directions"]
    if dirs["refused"] is not None:
        print(f"\ndirections not compared: {dirs['refused']}")
        return
    print(f"\nshared basis (token-embedding mean row cosine {dirs['checks']['embedding_cosine']:.4f}): "
          f"read-out cosine {_fmt(dirs['readout_cosine'])}, in the residual stream "
          f"{_fmt(dirs['residual_readout_cosine'])}")
    print(table(["depth", "cosine of mean chosen − rejected"],
                [(f"{r['depth']:.2f}", _value(r["cosine"])) for r in dirs["by_depth"]]))


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.3f}"


COMMANDS = [Command("compare", "compare two reward models on the same pairs (agreement, lens, attribution, "
                    "probes; directions when they share a backbone)", _arguments, _compare, _show)]
