"""`patch` and `faithfulness`: the causal engine on the command line."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..errors import UsageError
from ._common import (
    ArgumentError,
    Command,
    add_model_options,
    add_pairs_options,
    finite,
    load_model,
    positive,
    read_pairs,
    table,
)

if TYPE_CHECKING:
    import numpy as np

    from ..data import Pair
    from ..model import RewardModel
    from ..types import Ablation, Estimand, Mode, PatchLevel, Positions, Spans, Versus


def positions(text: str) -> Positions | Spans:
    """'read', 'all', 'prefix', or spans 'start:stop[,start:stop...]' counted back from the read token when negative."""
    if text in ("read", "all", "prefix"):
        return cast("Positions", text)  # one of its names, just checked
    spans: list[tuple[int | None, int | None]] = []
    for part in text.split(","):
        if part.count(":") != 1:
            raise argparse.ArgumentTypeError(
                f"expected 'read', 'all', 'prefix' or spans like '-4:' or '0:3,-2:', got {text!r}")
        lo, hi = part.split(":")
        try:
            spans.append((int(lo) if lo.strip() else None, int(hi) if hi.strip() else None))
        except ValueError:
            raise argparse.ArgumentTypeError(f"span bounds must be integers, got {part!r}") from None
    return spans


def rank_parts(names: Sequence[str], effect: np.ndarray, margin: np.ndarray, top: int, *, min_margin: float = 1e-4,
               flagged: np.ndarray | None = None) -> dict[str, Any]:
    """The `top` parts by mean |effect| over pairs [n, P], with the signed mean effect beside it, the share of
    each pair's own margin (`stats.margin_share`, |margin|-weighted) and the share of the margin as a ratio of
    means (mean effect / mean margin), None with a reason when undefined; `share_warning` says when the ratio
    of means is ill-conditioned (`stats.share_warning`). Ranked by `stats.top_parts` (mean |effect|, NaN last,
    ties in part order), the rule `Patching.top` and the audit use."""
    import numpy as np

    from ..stats import margin_share, mean_abs, share_warning, top_parts

    n = effect.shape[0]
    if n == 0:
        return {"mean_margin": None, "share_note": "no pairs: nothing to average", "share_warning": None,
                "top_parts": []}
    size, mean, share = mean_abs(effect), effect.mean(0), margin_share(effect, margin, min_margin)
    mean_margin = float(margin.mean())
    note = None
    if not math.isfinite(mean_margin) or abs(mean_margin) < min_margin:
        note = f"mean margin {mean_margin:.3g} is under {min_margin:g}: a share of it is undefined"
    return {
        "mean_margin": finite(mean_margin), "mean_abs_margin": finite(float(np.abs(margin).mean())),
        "share_note": note, "share_warning": share_warning(margin, min_margin),
        "top_parts": [
            {"part": names[i], "mean_abs_effect": finite(float(size[i])), "mean_effect": finite(float(mean[i])),
             "share": finite(float(share[i])),
             "share_of_mean_margin": None if note else finite(float(mean[i]) / mean_margin),
             "flagged_share": None if flagged is None else float(flagged[:, i].mean())}
            for i in top_parts(effect, top)
        ],
    }


def patch_summary(model: RewardModel, pairs: Sequence[Pair], *, mode: Mode | None = None, ablation: Ablation = "zero",
                  positions: Positions | Spans = "read", level: PatchLevel = "sublayer", estimand: Estimand = "total",
                  divergence: bool = False, atp: bool = False, top: int = 10, all_parts: bool = False,
                  batch_size: int = 8, progress: bool = False, neurons: list[str] | int | None = None,
                  ) -> dict[str, Any]:
    """The JSON-ready result of `rewardlens patch` (also a section of `rewardlens audit`). `neurons` (level
    'neuron'): the neurons to patch, or a count k: the k neurons attribution patching ranks first."""
    from ..causal import agreement, attribution_patch, patch

    if atp and estimand != "total":
        raise UsageError("--atp estimates total effects; drop --estimand direct")
    chosen_by = None
    if isinstance(neurons, int):  # first order proposes (one backward), exact patching then scores
        ranked = attribution_patch(model, pairs, batch_size=batch_size, mode=mode, ablation=ablation,
                                   positions=positions, level="neuron", progress=progress)
        neurons = [name for name, _ in ranked.top(len(ranked.names)) if "_N" in name][:neurons]
        chosen_by = f"the top {len(neurons)} neurons by attribution patching's mean |effect|"
    res = patch(model, pairs, estimand=estimand, divergence=divergence, batch_size=batch_size, mode=mode,
                ablation=ablation, positions=positions, level=level, progress=progress, neurons=neurons)

    out: dict[str, Any] = {
        "mode": res.mode, "ablation": ablation if res.mode == "ablation" else None, "positions": res.positions,
        "level": res.level, "estimand": res.estimand, "n_pairs": len(res.pair_ids),
        "near_zero_margin_pairs": [pid for pid, z in zip(res.pair_ids, res.near_zero) if z],
        **rank_parts(res.names, res.effect, res.margin, top, min_margin=res.min_margin,
                     flagged=res.flagged if divergence else None),
        "reliability": {k: finite(v) for k, v in res.reliability().items()} if divergence else None,
        "attribution_patching_agreement": None,
        "neurons_chosen_by": chosen_by,
        "engine": None if res.provenance is None else str(res.provenance),
        "pairs": [
            {"id": pid, "margin": float(m), "effects": dict(zip(res.names, map(float, e)))}
            for pid, m, e in zip(res.pair_ids, res.margin, res.effect)
        ] if all_parts else [],
    }
    if atp:
        approx = attribution_patch(model, pairs, batch_size=batch_size, mode=mode, ablation=ablation,
                                   positions=positions, level=level, progress=progress, neurons=neurons)
        out["attribution_patching_agreement"] = {k: finite(v) for k, v in agreement(res, approx, top).items()}
    return out


def _patch(args: argparse.Namespace) -> dict[str, Any]:
    pairs = read_pairs(args)
    return patch_summary(load_model(args), pairs, mode=args.mode, ablation=args.ablation or "zero",
                         positions=args.positions, level=args.level, estimand=args.estimand,
                         divergence=args.divergence, atp=args.atp, top=args.top, all_parts=args.all_parts,
                         batch_size=args.batch_size, progress=not args.quiet, neurons=args.neurons)


def show_patch(result: dict[str, Any]) -> None:
    """Print `patch_summary`'s result as the table `rewardlens patch` shows (also a section of the audit's)."""
    what = f"{result['estimand']} effect, {result['mode']}, {result['positions']} positions, {result['level']} level"
    print(f"top parts by mean |effect| over {result['n_pairs']} pairs on the chosen − rejected margin ({what}; exact),")
    print("with the signed mean effect, its share of each pair's own margin (|margin|-weighted) and the mean "
          "effect / mean margin:")
    num = lambda v, spec: "-" if v is None else format(v, spec)
    if result.get("engine"):
        print(f"computed by {result['engine']}")
    rows = [(t["part"], num(t["mean_abs_effect"], ".4f"), num(t["mean_effect"], "+.4f"), num(t.get("share"), "+.3f"),
             num(t["share_of_mean_margin"], "+.3f"), num(t["flagged_share"], ".2f")) for t in result["top_parts"]]
    print(table(["part", "mean |effect|", "mean effect", "share of own margins", "mean effect / mean margin",
                 "OOD share"], rows))
    if result.get("share_warning"):
        print(f"\n{result['share_warning']}")
    if result.get("neurons_chosen_by"):
        print(f"\nneurons patched: {result['neurons_chosen_by']}")
    if result["share_note"]:
        print(f"\nmean effect / mean margin is undefined (-): {result['share_note']}")
    if result["near_zero_margin_pairs"]:
        print(f"\npairs with a near-zero margin: {', '.join(result['near_zero_margin_pairs'])}")
    if result["reliability"]:
        r = result["reliability"]
        pct = lambda v: "-" if v is None else f"{v:.1%}"
        print(f"\nout-of-distribution patched runs: {pct(r['flagged_share'])} of runs, carrying "
              f"{pct(r['effect_share_flagged'])} of the total |effect|"
              + ("" if r["effect_share_flagged"] is not None else " (- : no effect to share)"))
    if result["attribution_patching_agreement"]:
        a = result["attribution_patching_agreement"]
        print(f"\nattribution patching vs exact: Spearman (mean effects) {a['spearman_mean']}, "
              f"per pair {a['spearman_per_pair']}, top-{a['k']:g} overlap {num(a['topk_overlap'], '.2f')}"
              + ("" if None not in a.values() else " (None: undefined, e.g. one pair or constant effects)"))


def _faithfulness(args: argparse.Namespace) -> dict[str, Any]:
    from ..causal import faithfulness

    pairs = read_pairs(args)
    model = load_model(args)
    rep = faithfulness(model, pairs, level=args.level, mode=args.mode, n_boot=args.boot, batch_size=args.batch_size,
                       paper=args.paper_statistic, progress=not args.quiet)
    rows = [{k: (finite(v) if isinstance(v, float) else v) for k, v in row.items()} for row in rep.rows()]
    estimands: tuple[Versus, ...] = ("direct", "total", "indirect")
    return {
        "level": rep.level, "mode": rep.mode, "seed_positions": rep.seed_positions, "summary": rows,
        "attribution_patching_agreement": {k: finite(v) for k, v in rep.agreement().items()},
        "engines": {name: str(p) for name, p in (rep.provenance or {}).items()},
        "pairs": [
            {"id": pid, **{f"rho_{e}": finite(float(rep.rho(e)[i])) for e in estimands},
             "seed_rho": finite(float(rep.seed_rho[i]))}
            for i, pid in enumerate(rep.pair_ids)
        ],
    }


def _show_faithfulness(result: dict[str, Any]) -> None:
    print(f"Spearman ρ between attribution and each estimand, per pair then pooled (95% bootstrap CI over pairs; "
          f"{result['mode']}, {result['level']} level):")
    fmt = lambda v: "nan" if v is None else f"{v:+.3f}"
    print(table(["comparison", "mean ρ", "CI low", "CI high", "pairs"],
                [(r["comparison"], fmt(r["rho"]), fmt(r["lo"]), fmt(r["hi"]), r["pairs"]) for r in result["summary"]]))
    from ..types import SEED_PAPER, SEED_PAPER_RHO

    reported = ", ".join(f"{v:+.3f}".replace("-", "−") + f" ({k})" for k, v in SEED_PAPER_RHO.items())
    print(f"\nseed paper ({SEED_PAPER}), same statistic: ρ = {reported}")
    for name, engine in result.get("engines", {}).items():
        print(f"{name} computed by {engine}")


def neuron_choice(text: str) -> list[str] | int:
    """`--neurons`: 'mlp_L1_N17,mlp_L3_N2' (names, checked against the model by `patch`) or 'top:K'."""
    if text.startswith("top:"):
        count = text[4:]
        if not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"'top:K' takes a count K >= 1, got {text!r}")
        return int(count)
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected neuron names like 'mlp_L1_N17,mlp_L3_N2' or 'top:20', got {text!r}")
    return names


def _check_patch(args: argparse.Namespace) -> None:
    if (args.level == "neuron") != (args.neurons is not None):
        raise ArgumentError(
            f"--neurons {'needs --level neuron' if args.neurons is not None else 'is needed with --level neuron'}: "
            "exact patching of every neuron is one run per neuron; pass --level neuron --neurons "
            "mlp_L1_N17,... or --neurons top:20 (the top 20 by attribution patching, then patched exactly)")
    if args.atp and args.estimand != "total":
        raise ArgumentError("--atp estimates total effects; drop --estimand direct")
    if args.ablation is not None and args.mode != "ablation":
        mode = args.mode or "noising (the default)"
        raise ArgumentError(f"--ablation {args.ablation} picks what --mode ablation writes, but --mode is {mode}, "
                            "which patches in the other side's activations; pass --mode ablation too, "
                            "or drop --ablation")


def _options(kind: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        add_model_options(p)
        add_pairs_options(p)
        p.add_argument("--mode", choices=["noising", "denoising", "ablation"], default=None,
                       help="default: noising, or zero ablation for a reward read at a set of positions whose two "
                            "sides have no read-to-read map (PRM answers of different step counts, DPO responses of "
                            "different lengths), as the library does")
        levels = ["sublayer", "head", "neuron"] if kind == "patch" else ["sublayer", "head"]
        p.add_argument("--level", choices=levels, default="sublayer",
                       help="neuron: the MLP neurons chosen by --neurons" if kind == "patch" else None)
        if kind == "patch":
            p.add_argument("--neurons", type=neuron_choice, default=None,
                           help="with --level neuron: 'mlp_L1_N17,mlp_L3_N2' (as attribute --level neuron names them), "
                                "or 'top:K', the K neurons attribution patching ranks first (one backward), then "
                                "patched exactly")
            p.add_argument("--ablation", choices=["zero", "mean"], default=None,
                           help="with --mode ablation: write zeros (default) or the mean activation")
            p.add_argument("--positions", type=positions, default="read",
                           help="'read' (default), 'all' (token-aligned pairs), 'prefix' (the first min(len) tokens "
                                "of both sides, the rule of the seed paper, arXiv:2604.26130) or spans like '-4:'")
            p.add_argument("--estimand", choices=["total", "direct"], default="total")
            p.add_argument("--divergence", action="store_true", help="score patched runs against natural activations")
            p.add_argument("--atp", action="store_true", help="also run attribution patching and report agreement")
            p.add_argument("--top", type=positive(int), default=10)
            p.add_argument("--all-parts", action="store_true", help="JSON: every part's effect per pair")
        else:
            p.add_argument("--boot", type=positive(int), default=2000, help="bootstrap resamples")
            p.add_argument("--paper-statistic", action="store_true",
                           help="also the seed paper's (arXiv:2604.26130) statistic its own way: prefix noising over "
                                "attention and MLP sublayers (one more patched forward of the chosen sides per "
                                "sublayer)")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
    return add


COMMANDS = [
    Command("patch", "activation patching between chosen and rejected", _options("patch"), _patch, show_patch,
            check=_check_patch),
    Command("faithfulness", "attribution vs direct, total and indirect effects", _options("faith"), _faithfulness,
            _show_faithfulness),
]
