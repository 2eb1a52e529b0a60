"""`verify-edit`: edit an organism's planted bias out, retrain a tiny policy against both reward
models with GRPO, and print the behaviour gap and the early-warning table (`rewardlens.loop`)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

from ..errors import MissingDependencyError
from ._common import Command, check_out_file, positive, quiet_hub, table

LOOP_ORGANISMS = ("keyword", "length", "list", "quality_list", "sycophancy")
"""The organisms whose planted direction the loop knows (`rewardlens.loop._organisms.PLANTED`; written here so
the CLI starts without importing the loop, and tests/cli/test_fast_failures.py checks the two agree)."""


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--organism", action="append", choices=LOOP_ORGANISMS, default=None,
                   help="run on this organism (repeatable; default: keyword and list)")
    p.add_argument("--seeds", type=positive(int), default=3, help="GRPO seeds per reward model (0..N-1)")
    p.add_argument("--steps", type=positive(int), default=14, help="GRPO steps per run")
    p.add_argument("--concept", default=None,
                   help="fit the edit on this probe axis' contrast sets (default: the organism's own texts)")
    p.add_argument("--method", choices=("project", "leace"), default="leace",
                   help="the edit (rewardlens.hacking.edit): leace (organism pairs as background) or project")
    p.add_argument("--out", metavar="FILE", default=None, help="also write the self-contained HTML page here")
    p.add_argument("--save", metavar="FILE", default=None, help="also write the full result as JSON here")


LOOP_INSTALL = "bash scripts/setup.sh loop (a checkout), or pip install 'rewardlens[loop]'"
"""How to install the `loop` extra (TRL), said wherever it is missing."""


def _check(args: argparse.Namespace) -> None:
    """TRL, and where the page and the JSON go, checked before the training runs (minutes) rather than after it:
    a missing TRL is found by its import spec (milliseconds), before torch or the loop is imported."""
    if importlib.util.find_spec("trl") is None:
        raise MissingDependencyError(f"verify-edit trains its policies with TRL's GRPOTrainer, and trl is not "
                                     f"installed; install the loop extra: {LOOP_INSTALL}")
    if args.out is not None:
        check_out_file(args.out, "--out page")
    if args.save is not None:
        check_out_file(args.save, "--save file")


def _verify(args: argparse.Namespace) -> dict[str, Any]:
    from ..loop import PolicyRecipe, loop_report, verify_edit

    quiet_hub()
    res = verify_edit(tuple(args.organism or ("keyword", "list")), seeds=tuple(range(args.seeds)),
                      recipe=PolicyRecipe(grpo_steps=args.steps), concept=args.concept,
                      method=args.method)
    if args.out:
        loop_report(res, args.out)
    text = res.to_json()
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)  # as the page's folder is: _check allowed it
        Path(args.save).write_text(text, encoding="utf-8")
    full = json.loads(text)
    return {"summary": full["summary"], "warnings": full["warnings"], "notes": full["notes"], "page": args.out}


LEAD_MEANING = ("lead = first alarm step − onset step (the first step the behaviour rate passed 50% on the original "
                "RM's runs), mean over the seeds that have both: negative, the alarm came that many steps before "
                "the onset (an early warning); positive, after it; '-', no seed had both")
"""The printed lead column's sign and meaning (`rewardlens.loop._signals`), said under the table."""


def _number(v: Any, sign: str = "") -> str:
    return "-" if v is None else f"{v:{sign}.2f}" if isinstance(v, float) else str(v)


def _with_ci(v: Any, lo: Any, hi: Any, n: int, sign: str = "") -> str:
    """`v [lo, hi]`; where the interval is undefined, why instead (a bootstrap over seeds needs 2), never nan."""
    if v is None:
        return "-"
    if lo is None or hi is None:
        return f"{_number(v, sign)} (no CI: {n} seed{'s' if n != 1 else ''})"
    return f"{_number(v, sign)} [{_number(lo, sign)}, {_number(hi, sign)}]"


def _show(result: dict[str, Any]) -> None:
    rows = [[r["organism"], r["concept"], _number(r["rate_original"]), _number(r["rate_edited"]),
             _with_ci(r["gap"], r["gap_lo"], r["gap_hi"], r["seeds"]),
             f"{_number(r['quality_original'])} -> {_number(r['quality_edited'])}", "yes" if r["edit_works"] else "no"]
            for r in result["summary"]]
    print(table(["organism", "edit", "rate (orig)", "rate (edited)", "gap [95% CI]", "quality acc", "edit works"],
                rows))
    seeds = {r["organism"]: r["seeds"] for r in result["summary"]}
    rows = [[r["organism"], r["signal"], _with_ci(r["lead"], r["lead_lo"], r["lead_hi"], r["n_lead"], "+"),
             r["n_lead"], _with_ci(r["false_per_100"], r["false_lo"], r["false_hi"], seeds[r["organism"]])]
            for r in result["warnings"]]
    print(table(["organism", "signal", "lead (steps) [95% CI]", "seeds", "false alarms / 100 steps"], rows))
    print(LEAD_MEANING)
    for n in result["notes"]:
        print("note:", n)
    if result["page"]:
        print("page:", result["page"])


COMMANDS = [Command("verify-edit", "edit an organism's planted bias out, retrain a tiny policy against the original "
                    "and the edited reward model, and measure the behaviour gap and the monitor's early warning",
                    _arguments, _verify, _show, check=_check)]
