"""`score`, `lens` and `attribute`: the foundation's read-outs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._common import (
    Command,
    add_model_options,
    add_pairs_options,
    finite,
    fraction,
    load_model,
    pair_id,
    read_pairs,
    table,
)

if TYPE_CHECKING:
    from ..data import Pair
    from ..model import RewardModel
    from ..types import LensKind


def _score(model: RewardModel, pairs: list[Pair], args: argparse.Namespace) -> dict[str, Any]:
    """Each pair's rewards and the pair accuracy over the pairs with finite rewards (`score_pairs`: the
    others are named, never counted as losses; none finite is an error)."""
    from ..data import chosen, record_fields, rejected
    from ..model.internal import dtype_name, score_pairs

    rewards = model.score(pairs, batch_size=args.batch_size)
    ids = [pair_id(p, i) for i, p in enumerate(pairs)]
    counted, acc = score_pairs(rewards, ids, dtype=dtype_name(model))
    good, bad = chosen(rewards), rejected(rewards)
    return {
        "pairs": [  # with the record's subset, group and other fields, so scores join back to the user's data
            {**record_fields(p, pid, taken=_SCORE_KEYS), "chosen": finite(c), "rejected": finite(r),
             "margin": finite(c - r), "counted": bool(ok)}
            for p, pid, c, r, ok in zip(pairs, ids, good, bad, counted.finite.tolist())
        ],
        **{k: v for k, v in acc.to_dict().items() if k in ("accuracy", "correct", "excluded", "saturated", "notes")},
        "counted": acc.n, "line": acc.line(),
    }


_SCORE_KEYS = ("chosen", "rejected", "margin", "counted")
"""A score row's own keys: a record field of one of these names is written as `record.<name>`."""


def _lens(model: RewardModel, pairs: list[Pair], args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from ..exact import lens

    ln = lens(model, pairs, batch_size=args.batch_size)
    out: dict[str, Any] = {"n_layers": ln.n_layers, "fraction": args.fraction, "pairs": []}
    kinds: tuple[LensKind, ...] = ("linear", "normed")
    for kind in kinds:
        depth = ln.crystallization(kind, args.fraction)
        out[f"median_crystallization_{kind}"] = float(np.nanmedian(depth)) if np.isfinite(depth).any() else None
    lin, nrm = ln.margin("linear"), ln.margin("normed")
    dl, dn = ln.crystallization("linear", args.fraction), ln.crystallization("normed", args.fraction)
    near_zero = ln.near_zero_margin()
    for i, p in enumerate(pairs):
        out["pairs"].append({
            "id": pair_id(p, i), "linear_margin": lin[i].tolist(), "normed_margin": nrm[i].tolist(),
            "crystallization_linear": None if np.isnan(dl[i]) else float(dl[i]),
            "crystallization_normed": None if np.isnan(dn[i]) else float(dn[i]),
            "near_zero_final_margin": bool(near_zero[i]),
        })
    return out


def _attribute(model: RewardModel, pairs: list[Pair], args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from ..data import margin as pair_margin
    from ..exact import attribute
    from ..stats import mean_abs, top_parts

    att = attribute(model, pairs, level=args.level, batch_size=args.batch_size)
    reward_margin = pair_margin(att.reward)
    margin = att.margin
    size = mean_abs(margin)  # what the table is ranked by (`stats.top_parts`), beside the signed mean
    return {
        "level": att.level,
        "max_abs_residual_error": float(np.abs(att.residual_error).max()),
        "top_parts": [{"part": att.names[i], "mean_abs_margin": float(size[i]),
                       "mean_margin": float(margin[:, i].mean())} for i in top_parts(margin, args.top)],
        "pairs": [
            {"id": pair_id(p, i), "margin": float(reward_margin[i]),
             "parts": dict(zip(att.names, map(float, margin[i])))}
            for i, p in enumerate(pairs)
        ] if args.all_parts else [],
    }


def _show_score(result: dict[str, Any]) -> None:
    # NaN and inf are None in the result (JSON's null); a pair left out of the accuracy says so in its row.
    cell = lambda x: "non-finite" if x is None else x  # noqa: E731
    marked = bool(result["excluded"])  # the extra column only when a pair was left out
    rows = [[p["id"], cell(p["chosen"]), cell(p["rejected"]), cell(p["margin"]),
             *(["" if p["counted"] else "excluded"] if marked else [])] for p in result["pairs"]]
    print(table(["pair", "chosen", "rejected", "margin", *(["accuracy"] if marked else [])], rows))
    print(f"\n{result['line']}")


def _show_lens(result: dict[str, Any]) -> None:
    headers = ["pair"] + [f"d{i}" for i in range(result["n_layers"] + 1)] + ["crystal."]
    rows = [[p["id"], *map(float, p["linear_margin"]), "-" if p["crystallization_linear"] is None
             else f"{p['crystallization_linear']:.2f}"] for p in result["pairs"]]
    print("linear-lens chosen − rejected margin by depth (d0 = embeddings; exact, final norm scale frozen)")
    print(table(headers, rows))
    print(f"\nmedian crystallization depth (l/L, fraction {result['fraction']}): "
          f"linear {result['median_crystallization_linear']}, normed {result['median_crystallization_normed']}")


def _show_attribute(result: dict[str, Any]) -> None:
    print(f"top parts by mean |chosen − rejected contribution| over pairs ({result['level']} level, exact), with the "
          "signed mean:")
    print(table(["part", "mean |margin|", "mean margin"],
                [(t["part"], t["mean_abs_margin"], t["mean_margin"]) for t in result["top_parts"]]))
    print(f"\nlargest |reward − (Σ parts + constant)|: {result['max_abs_residual_error']:.2e}")


def _options(*, level: bool = False, lens_: bool = False) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        add_model_options(p)
        add_pairs_options(p)
        if level:
            p.add_argument("--level", default="sublayer", choices=["sublayer", "head", "neuron"])
            p.add_argument("--top", type=int, default=10, help="how many parts to list")
            p.add_argument("--all-parts", action="store_true", help="JSON: include every part's margin per pair")
        if lens_:
            p.add_argument("--fraction", type=fraction, default=0.5,
                           help="crystallization threshold (share of final margin)")
    return add


def _with_model(fn: Callable[[RewardModel, list[Pair], argparse.Namespace], dict[str, Any]]
                ) -> Callable[[argparse.Namespace], dict[str, Any]]:
    def run(args: argparse.Namespace) -> dict[str, Any]:
        pairs = read_pairs(args)  # a bad pairs file is named before the model loads
        return fn(load_model(args), pairs, args)
    return run


COMMANDS = [
    Command("score", "score preference pairs", _options(), _with_model(_score), _show_score),
    Command("lens", "reward lens and crystallization depth", _options(lens_=True), _with_model(_lens), _show_lens),
    Command("attribute", "exact component attribution", _options(level=True), _with_model(_attribute),
            _show_attribute),
]
