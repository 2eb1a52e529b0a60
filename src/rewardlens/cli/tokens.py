"""`tokens`: which source tokens each response's reward was read from, split exactly (docs/tokens.md).

By default the content view: the response's tokens and the prompt's, each ranked by |exact direct|,
and the template's tokens (role headers, special ids, separators) grouped into one row with its share,
closed by what is written at the read token and the constant (exact/_token_view.py). `--view all`
lists every token, template included, as before.
"""

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
    p.add_argument("--top", type=positive(int), default=10,
                   help="tokens to list per response (content view: per response and per prompt), by |exact direct|")
    p.add_argument("--view", default="content", choices=["content", "all"],
                   help="content: the response's and prompt's own tokens, the template's grouped into one row "
                        "(default); all: every token, template included")
    p.add_argument("--baseline", default="zero", choices=["zero", "pad"],
                   help="embedding baseline of the first-order total-effect estimate")
    p.add_argument("--no-approx", action="store_true", help="skip the gradient × embedding total-effect estimate")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


QUESTIONS = (
    "exact direct: what the token writes into the reward through one attention hop into the read token; exact: "
    "every token's value, what is written at the read token and the constant sum to the reward ('which words is "
    "this reward read from')",
    "total ≈ (grad×emb): a first-order estimate of the token's total effect through every path ('what would "
    "replacing this token change'); approximate, sums to nothing, a hint for where to patch",
)
"""Which column answers which question, printed above the tables (docs/tokens.md says the same)."""


def _top(ta: Any, i: int, k: int, role: str | None) -> list[dict[str, Any]]:
    return [{"position": p, "token": t, "value": v,
             **({} if ta.total_approx is None else {"total_approx": float(ta.total_approx[i][p])})}
            for p, t, v in ta.top(i, k, role)]


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
        read = int(ta.read_index[i])
        groups = ta.groups(i)
        row: dict[str, Any] = {
            "row": label, "pair": pair_id(pairs[pair], pair), "side": side, "reward": float(ta.reward[i]),
            "tokens_sum": float(ta.values[i].sum()), "at_read": float(ta.at_read[i]),
            "constant": float(ta.constant[i]), "residual_error": float(ta.residual_error[i]),
            "read_index": read, "read_token": ta.tokens[i][read], "read_role": ta.role_names(i)[read],
            "top": _top(ta, i, args.top, None),
            "top_response": _top(ta, i, args.top, "response"), "top_prompt": _top(ta, i, args.top, "prompt"),
            "groups": groups,
            "group_tokens": {r: ta.role_names(i).count(r) for r in ("response", "prompt", "template")},
            "shares": {g: finite(v / float(ta.reward[i])) if ta.reward[i] else None for g, v in groups.items()},
            "shares_ill_conditioned": ta.ill_conditioned(i),
        }
        if agreement is not None:
            row["approx_spearman"] = finite(float(agreement["spearman"][i]))
            row["approx_topk_overlap"] = float(agreement["topk_overlap"][i])
        rows.append(row)
    return {
        "baseline": ta.baseline, "view": args.view, "rows": rows, "columns": list(QUESTIONS),
        "max_abs_residual_error": float(np.abs(ta.residual_error).max()),
        "note": "each side has its own tokens: no token-level chosen − rejected difference exists",
    }


def _cells(tops: list[dict[str, Any]], approx: bool) -> list[list[Any]]:
    return [[t["position"], repr(t["token"]), t["value"]] + ([t["total_approx"]] if approx else []) for t in tops]


def _share(row: dict[str, Any], group: str) -> str:
    share = row["shares"][group]
    return "n/a" if share is None else f"{100 * share:+.1f} %"


def _grouped(row: dict[str, Any]) -> None:
    """The grouped closure: response, prompt, template, at read, constant = reward, each with its share."""
    n = row["group_tokens"]
    names = {"response": f"response tokens ({n['response']})", "prompt": f"prompt tokens ({n['prompt']})",
             "template": f"template tokens ({n['template']}: headers, special ids, separators)",
             "at_read": "written at the read token (embeddings, MLPs, biases)", "constant": "constant"}
    cells = [[names[g], v, _share(row, g)] for g, v in row["groups"].items()]
    cells.append(["= reward", sum(row["groups"].values()), "100.0 %"])
    print(table(["where the reward comes from", "exact direct", "share of reward"], cells))
    if row["shares_ill_conditioned"]:
        print("note: |reward| is under 10 % of Σ|rows|: the shares swing with small changes; read the values")


def _show(result: dict[str, Any]) -> None:
    approx = result["baseline"] is not None
    headers = ["pos", "token", "exact direct"] + (["total ≈ (grad×emb)"] if approx else [])
    print("columns: " + result["columns"][0] + (";\n         " + result["columns"][1] if approx else ""))
    for row in result["rows"]:
        print(f"\n{row['row']} (pair {row['pair']}, {row['side']}): reward {row['reward']:+.4f}, "
              f"read at token {row['read_index']} {row['read_token']!r} ({row['read_role']})")
        if result["view"] == "all":
            print(table(headers, _cells(row["top"], approx)))
            print(f"Σ tokens {row['tokens_sum']:+.4f} + at t* {row['at_read']:+.4f} + constant "
                  f"{row['constant']:+.4f} = {row['tokens_sum'] + row['at_read'] + row['constant']:+.4f} "
                  f"(reward {row['reward']:+.4f})")
        else:
            for role in ("response", "prompt"):
                if row[f"top_{role}"]:
                    print(f"{role} tokens, largest |exact direct| first:")
                    print(table(headers, _cells(row[f"top_{role}"], approx)))
            _grouped(row)
        if approx:
            rho = row["approx_spearman"]
            print(f"approximate total effect vs exact direct split: Spearman {'nan' if rho is None else f'{rho:.3f}'}"
                  f", top-k overlap {row['approx_topk_overlap']:.2f}")
    print(f"\nlargest |reward − (Σ tokens + at t* + constant)|: {result['max_abs_residual_error']:.2e}")
    if result["view"] == "content":
        print("view: content (the template's tokens grouped into one row); --view all lists every token")
    print(f"note: {result['note']}")


COMMANDS = [Command("tokens", "exact per-token split of each response's reward (which words write it)",
                    _arguments, _run, _show)]
