"""`calibrate`: grade the instruments on model organisms and print (and save) the scorecard."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._common import Command, check_out_file, positive, quiet_hub, table

ORGANISMS = ("circuit", "confidence", "keyword", "length", "list", "quality_list", "sycophancy", "two_objective",
             "two_step")
"""The names of `rewardlens.zoo.organisms.ORGANISMS` (tests/cli checks the two agree)."""
KINDS = ("dpo_keyword", "prm_steps")
"""The names of `rewardlens.zoo.organisms.KIND_ORGANISMS`, the PRM and DPO organisms (tests/calibrate checks)."""


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, help="also write the scorecard as JSON to this file")
    p.add_argument("--organism", action="append", choices=ORGANISMS + KINDS, default=None,
                   help="grade on this organism only (repeatable; default: all)")
    p.add_argument("--seed", type=int, default=0, help="organism seed (each seed is trained once, then cached)")
    p.add_argument("--n-pairs", type=positive(int), default=100, help="held-out pairs per organism")


def _calibrate(args: argparse.Namespace) -> dict[str, Any]:
    from ..calibrate import calibrate

    quiet_hub()
    card = calibrate(organisms=args.organism, seed=args.seed, n_pairs=args.n_pairs,
                     progress=lambda line: print(line, file=sys.stderr))
    if args.out:
        card.to_json(args.out)
    return {**card.to_dict(), "out": args.out}


def _show(result: dict[str, Any]) -> None:
    value = lambda v: "- (undefined)" if v is None or v != v else f"{v:.4g}"  # None or NaN: no number
    rows = [(r["instrument"], r["organism"], r["check"], value(r["value"]), f"{r['compare']} {r['threshold']:g}",
             "pass" if r["passed"] else "known" if r["known"] else "FAIL") for r in result["rows"]]
    print(table(["instrument", "organism", "check", "value", "needs", "result"], rows))
    n_ok = sum(r["passed"] for r in result["rows"])
    known = [r for r in result["rows"] if r["known"] and not r["passed"]]
    print(f"\n{n_ok}/{len(rows)} checks passed ({result['settings']['seconds']} s)"
          + (f"; {len(known)} known limitations failed as expected (not counted)" if known else "")
          + (f"; scorecard written to {result['out']}" if result["out"] else ""))
    for r in known:
        print(f"  known: {r['organism']}: {r['check']}: {r['known']}")


def _check(args: argparse.Namespace) -> None:
    if args.out:
        check_out_file(args.out, "--out file")


COMMANDS = [
    Command("calibrate", "grade the instruments on model organisms with planted rules", _arguments, _calibrate, _show,
            exit_code=lambda result: 0 if result["passed"] else 1, check=_check),
]
