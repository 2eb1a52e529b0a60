"""`parity`: rewardlens' scores against the model's own forward, one line per score-parity bug
(batch size, padding side, double BOS, pad = eos, TRL's read token; docs/scoring.md, *Score parity*)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._common import Command, add_model_options, add_pairs_options, finite, load_model, read_pairs, table


def _arguments(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    add_pairs_options(p)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from ..model import parity

    pairs = read_pairs(args)  # a bad pairs file is named before the model loads
    result = parity(load_model(args), pairs)
    rows = result.to_frame().to_dict("records")
    checks = [{**c, "difference": finite(c["difference"])} for c in rows]  # NaN → null in JSON
    return {"dtype": result.dtype, "passed": result.passed, "checks": checks}


def failure_lines(result: dict[str, Any]) -> list[str]:
    """One line per failed check: its name, its largest |difference| and the tolerance it exceeds."""
    return [f"rewardlens: parity: check {c['name']} failed: largest |difference| "
            f"{'nan' if c['difference'] is None else format(c['difference'], '.3e')} > tolerance "
            f"{c['tolerance']:.1e} ({result['dtype']})" for c in result["checks"] if not c["passed"]]


def _show(result: dict[str, Any]) -> None:
    rows = [[c["name"], "nan" if c["difference"] is None else f"{c['difference']:.3e}", f"{c['tolerance']:.1e}",
             c["n"], "ok" if c["passed"] else "FAILED"] for c in result["checks"]]
    print(table(["check", "largest |difference|", "tolerance", "sequences", ""], rows))
    print(f"dtype {result['dtype']}: " + ("every check within tolerance" if result["passed"] else "parity FAILED"))


def _exit_code(result: dict[str, Any]) -> int:
    lines = failure_lines(result)
    for line in lines:  # printed whatever the output format: a --json run fails as loudly
        print(line, file=sys.stderr)
    return 1 if lines else 0


COMMANDS = [Command("parity", "rewardlens' scores against the model's own forward: the five score-parity bugs",
                    _arguments, _run, _show, exit_code=_exit_code)]
