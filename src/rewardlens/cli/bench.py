"""`bench`: a reward model on RewardBench-schema pairs, scored as RewardBench scores it (docs/bench.md)."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (
    ArgumentError,
    Command,
    add_model_options,
    add_pairs_options,
    check_model,
    load_model,
    positive,
    read_pairs,
    table,
)


def _arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_pairs_options(p)
    p.add_argument("--against", metavar="MODEL2", default=None,
                   help="a second model (folder or hub id, loaded with the same options): paired differences")
    p.add_argument("--n-boot", type=positive(int), default=2000,
                   help="bootstrap resamples for the Ties score's interval and, with --against, the differences' "
                        "intervals; at least 40 (each tail of a 95%% interval must hold a draw)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weighting", choices=("rewardbench", "items"), default="rewardbench",
                   help="section weights: RewardBench's fixed EXAMPLE_COUNTS (default: the benchmark's own, "
                        "stratified estimate on a sample) or the items scored per subset")
    p.add_argument("--best-of-n-ties", choices=("shared", "argmax"), default="shared",
                   help="a RewardBench 2 record whose chosen reward ties others at the top: 'shared' scores 1/k "
                        "among the k tied (rewardbench 0.1.4, the default); 'argmax' counts it right (the earlier "
                        "utils_v2.py rule)")


def _check(args: argparse.Namespace) -> None:
    from ..stats import min_boot

    if args.n_boot < min_boot(0.95):  # the command's intervals are 95%
        raise ArgumentError(f"--n-boot {args.n_boot} is under {min_boot(0.95)}: a 95% percentile interval needs at "
                            f"least 2 / (1 - 0.95) = {min_boot(0.95)} bootstrap draws to hold one in each tail; pass "
                            f"--n-boot {min_boot(0.95)} or more (the default 2000 is what a reported interval wants)")
    if args.against is not None:
        check_model(args.against)


def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from ..bench import bench

    pairs = read_pairs(args)  # a bad pairs file is named before any model loads
    first = load_model(args)
    second = load_model(argparse.Namespace(**{**vars(args), "model": args.against})) if args.against else None
    result = bench(first, pairs, against=second, batch_size=args.batch_size, n_boot=args.n_boot, seed=args.seed,
                   weighting=args.weighting, best_of_n_ties=args.best_of_n_ties)
    out = result.to_dict()
    out["paths"] = {"model": args.model, "against": args.against}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ci(ci: list[float | None]) -> str:
    return "-" if ci[0] is None or ci[1] is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _show(result: dict[str, Any]) -> None:
    from ..bench import NO_SUBSET  # here: importing bench loads torch, which --help should not wait for

    print(f"model: {result['paths']['model']}  {result['model']}")
    print(f"{result['n_pairs']} pairs, {result['n_items']} items (a RewardBench 2 group counts once)\n")
    for note in result["notes"]:  # pairs left out of every count (non-finite rewards), a saturated model
        print(f"note: {note}")
    if result["counted_items"] < result["n_items"]:
        print(f"every score below counts {result['counted_items']} of {result['n_items']} items: an item with a "
              "non-finite reward on any of its pairs is left out, never counted wrong\n")
    elif result["notes"]:
        print()
    rows = [(s["subset"] or NO_SUBSET, s["kind"], s["n"], f"{s['correct']:g}", _pct(s["accuracy"]), _ci(s["ci"]),
             s["section"] or "-", "-" if s["weight"] is None else f"{s['weight']:.3f}") for s in result["subsets"]]
    print(table(["subset", "kind", "n", "right", "accuracy", "95% Wilson CI", "section", "weight"], rows))
    level = f"{result['bootstrap']['level']:.0%}"
    if result["sections"]:
        weights = ("RewardBench's fixed EXAMPLE_COUNTS (math-prm 984, as much as all hep-* together)"
                   if result["weighting"] == "rewardbench"
                   else "the items scored (math-prm as much as the hep-* present)")
        print(f"\nRewardBench sections: subset accuracies weighted by {weights}; {level} CIs: MOVER-Wilson, the "
              "subsets' Wilson intervals combined with the section's weights")
        print(table(["section", "score", f"{level} CI", "n"],
                    [(k, _pct(v["value"]), _ci(v["ci"]), v["n"]) for k, v in result["sections"].items()]))
        missing = result["missing_sections"]
        note = f" (over {4 - len(missing)} of 4 sections; no items for {', '.join(missing)})" if missing else ""
        prior = " at weight 2, prior sets at weight 1" if "Prior Sets" in result["sections"] else ""
        print(f"\noverall (mean of the sections{prior}){note}: {_pct(result['overall']['value'])} "
              f"{_ci(result['overall']['ci'])}")
    else:
        print("\nno RewardBench 1 subset (alpacaeval-easy, ..., hep-rust): no section or overall score")
    if result["rewardbench2"]["value"] is not None:
        rb2 = result["rewardbench2"]
        print(f"RewardBench 2 (mean best-of-N accuracy of its subsets): {_pct(rb2['value'])} {_ci(rb2['ci'])}")
    if result["ties_subset"] is not None:
        t = result["ties_subset"]
        print(f"{t['subset']}: {_pct(t['score'])} {_ci(t['ci'])} = 0.30 tied accuracy {_pct(t['tied_accuracy'])} + "
              f"0.30 ref accuracy {_pct(t['ref_accuracy'])} + 0.20 {_pct(t['correctness_preferred'])} + 0.20 "
              f"{_pct(t['correctness_preferred_hard'])} + 0.01 margin {_pct(t['margin_score'])} "
              f"({t['n_matched']} prompts with both a ref and a tied record)")
    acc = result["accuracy"]
    over = f"all {acc['n']}" if acc["n"] == result["n_items"] else f"{acc['n']} of {result['n_items']}"
    print(f"accuracy over {over} items: {_pct(acc['value'])} {_ci(acc['ci'])} (Wilson)")  # notes: printed above
    print(f"ties: {result['ties']}")
    print(f"intervals: {result['intervals']}")
    if result["comparison"] is not None:
        _show_comparison(result)


def _show_comparison(result: dict[str, Any]) -> None:
    comp = result["comparison"]
    print(f"\nA: {result['paths']['model']}\nB: {result['paths']['against']}")
    print(f"A − B per score: {comp['level']:.0%} CI from a paired bootstrap over items ({comp['n_boot']} draws within "
          f"subsets, seed {comp['seed']}); p from a paired sign-flip test over items")
    rows = [(r["name"] if r["level"] == "subset" else f"{r['name']} ({r['level']})", r["n"], _pct(r["a"]),
             _pct(r["b"]), "-" if r["difference"] is None else f"{r['difference']:+.3f}", _ci(r["ci"]),
             "-" if r["p_value"] is None else f"{r['p_value']:.3f}") for r in comp["scores"]]
    print(table(["score", "n", "A", "B", "A − B", f"{comp['level']:.0%} CI", "p"], rows))


COMMANDS = [Command("bench", "RewardBench-style evaluation: per-subset accuracy, sections, overall, RewardBench 2 "
                    "best-of-N; --against compares two models", _arguments, _bench, _show, check=_check)]
