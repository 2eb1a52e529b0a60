"""`tokens`: which source tokens each response's reward was read from, split exactly (docs/tokens.md)."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (
    Command,
    add_model_options,
    add_pairs_options,
    finite,
    load_model,
    pair_id,
    positive,
    read_pairs,
    table,
)


def _arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_pairs_options(p)
    p.add_argument("--top", type=positive(int), default=10, help="tokens to list per response, by |value|")
    p.add_argument("--baseline", default="zero", choices=["zero", "pad"],
                   help="embedding baseline of the first-order total-effect estimate")
    p.add_argument("--no-approx", action="store_true", help="skip the gradient × embedding total-effect estimate")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from ..data import pair_of
    from ..exact import tokens

    pairs = read_pairs(args)  # a bad pairs file is named before the model loads
    model = load_model(args)
    ta = tokens(model, pairs, batch_size=args.batch_size, approx=not args.no_approx, baseline=args.baseline,
                progress=not args.quiet)
    agreement = None if ta.total_approx is None else ta.agreement(k=min(5, args.top))
    rows = []
    for i, label in enumerate(ta.rows):
        pair, side = pair_of(i)
        row: dict[str, Any] = {
            "row": label, "pair": pair_id(pairs[pair], pair), "side": side, "reward": float(ta.reward[i]),
            "tokens_sum": float(ta.values[i].sum()), "at_read": float(ta.at_read[i]),
            "constant": float(ta.constant[i]), "residual_error": float(ta.residual_error[i]),
            "read_index": int(ta.read_index[i]), "read_token": ta.tokens[i][int(ta.read_index[i])],
            "top": [{"position": p, "token": t, "value": v,
                     **({} if ta.total_approx is None else {"total_approx": float(ta.total_approx[i][p])})}
                    for p, t, v in ta.top(i, args.top)],
        }
        if agreement is not None:
            row["approx_spearman"] = finite(float(agreement["spearman"][i]))
            row["approx_topk_overlap"] = float(agreement["topk_overlap"][i])
        rows.append(row)
    return {
        "baseline": ta.baseline, "rows": rows,
        "max_abs_residual_error": float(np.abs(ta.residual_error).max()),
        "note": "each side has its own tokens: no token-level chosen − rejected difference exists",
    }


def _show(result: dict[str, Any]) -> None:
    approx = result["baseline"] is not None
    for row in result["rows"]:
        print(f"\n{row['row']} (pair {row['pair']}, {row['side']}): reward {row['reward']:+.4f}, "
              f"read at token {row['read_index']} {row['read_token']!r}")
        headers = ["pos", "token", "exact direct"] + (["total ≈ (grad×emb)"] if approx else [])
        cells = [[t["position"], repr(t["token"]), t["value"]] + ([t["total_approx"]] if approx else [])
                 for t in row["top"]]
        print(table(headers, cells))
        print(f"Σ tokens {row['tokens_sum']:+.4f} + at t* {row['at_read']:+.4f} + constant {row['constant']:+.4f} "
              f"= {row['tokens_sum'] + row['at_read'] + row['constant']:+.4f} (reward {row['reward']:+.4f})")
        if approx:
            rho = row["approx_spearman"]
            print(f"approximate total effect vs exact direct split: Spearman {'nan' if rho is None else f'{rho:.3f}'}"
                  f", top-k overlap {row['approx_topk_overlap']:.2f}")
    print(f"\nlargest |reward − (Σ tokens + at t* + constant)|: {result['max_abs_residual_error']:.2e}")
    print(f"note: {result['note']}")


COMMANDS = [Command("tokens", "exact per-token split of each response's reward (which words write it)",
                    _arguments, _run, _show)]
